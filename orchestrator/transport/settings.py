"""What an SSH-based transport needs to connect, fully resolved (``orchestrator.config``
reads hosts.yaml and ~/.ssh/config and fills this in; transports never read either)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class SSHSettings:
    host: str
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None
    known_hosts: str | None = None
    connect_timeout: float = 10.0
    #: the ProxyJump chain, resolved by ``orchestrator.config`` (first hop first)
    jumps: tuple["SSHSettings", ...] = ()

    @property
    def known_hosts_path(self) -> str:
        """The known_hosts file host keys are checked against and recorded in."""
        return os.path.expanduser(self.known_hosts or "~/.ssh/known_hosts")

    @property
    def host_key_name(self) -> str:
        """How known_hosts names this host: ``host`` on port 22, else ``[host]:port``."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def display(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port != 22 else ""
        via = f" via {self.proxy_jump}" if self.proxy_jump else ""
        return f"{user}{self.host}{port}{via}"
