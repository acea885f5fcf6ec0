"""Shared state of one ``dfo`` invocation: the inventory and one open transport per host."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class AppContext:
    hosts_file: str | None = None
    _inventory: Any = None
    _transports: dict[str, Any] = field(default_factory=dict)

    @property
    def inventory(self):
        """The validated inventory (hosts.yaml or the embedded default)."""
        if self._inventory is None:
            from ..config.inventory import load_inventory

            self._inventory = load_inventory(self.hosts_file)
        return self._inventory

    def host(self, name: str | None):
        """The HostConfig for ``name`` (or the default host)."""
        return self.inventory.get(name)

    def transport(self, name: str | None):
        """One transport (one SSH connection) per host per invocation, reused."""
        host = self.host(name)
        if host.name not in self._transports:
            from ..transport import open_transport

            self._transports[host.name] = open_transport(host)
        return self._transports[host.name]

    def close(self) -> None:
        for t in self._transports.values():
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing must never mask the real error
                pass
        self._transports.clear()
