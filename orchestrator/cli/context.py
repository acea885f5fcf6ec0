"""Shared state of one ``dfo`` invocation: the inventory and one open transport per host."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AppContext:
    hosts_file: str | None = None
    _inventory: Any = None
    _transports: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

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
        """One transport (one SSH connection) per host per invocation, reused. Safe to call
        from several threads (``--group``: one thread per host): the dict is guarded, and an
        SSH transport connects on first use, in the thread that uses it."""
        host = self.host(name)
        with self._lock:
            if host.name not in self._transports:
                from ..transport import open_transport

                self._transports[host.name] = open_transport(host)
            return self._transports[host.name]

    def group_hosts(self, name: str):
        """(GroupConfig, its members' HostConfigs, head first) for ``--group NAME``."""
        g = self.inventory.group(name)
        return g, [self.inventory.get(h) for h in g.hosts]

    def transport_for(self, host):
        """``transport(host.name)`` for engine code that is given HostConfigs."""
        return self.transport(host.name)

    def close(self) -> None:
        with self._lock:
            opened = list(self._transports.values())
        for t in opened:
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing must never mask the real error
                pass
        self._transports.clear()
