"""What one host of the inventory is (``HostConfig``) and the inventory itself."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..common.errors import ConfigError
from .host_tree import HostTree
from ..transport.settings import SSHSettings

TRANSPORTS = ("local", "ssh", "proxmox")


def did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True, kw_only=True)
class GpuLayout:
    target: tuple[str, ...] = ("cpu",)
    drafter: tuple[str, ...] = ("cpu",)


@dataclass(frozen=True, kw_only=True)
class HostConfig:
    name: str
    transport: str  # "local" | "ssh" | "proxmox"
    root: str  # absolute POSIX path
    ssh: SSHSettings | None = None
    vmid: int | None = None
    profile: str = "cpu"
    gpus: GpuLayout = field(default_factory=GpuLayout)
    wheelhouse: str | None = None
    index_url: str | None = None
    python: str | None = None
    fallbacks: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    #: ``cache.trusted_sources``: hosts whose compile-cache snapshots this host takes
    #: without ``--trust-other-hosts`` (a snapshot carries code torch runs)
    cache_trusted_sources: tuple[str, ...] = ()
    source: str = ""

    @property
    def tree(self) -> HostTree:
        return HostTree(self.root)

    def describe(self) -> str:
        """Where this host's commands run, for people: ``local``, ``root@pve``, ``root@pve ct 200``."""
        if self.transport == "local":
            return "this machine"
        assert self.ssh is not None
        if self.transport == "proxmox":
            return f"{self.ssh.display()} ct {self.vmid}"
        return self.ssh.display()


@dataclass(frozen=True, kw_only=True)
class GroupConfig:
    """``groups.NAME`` of hosts.yaml: hosts that form one multi-node job (docs/multinode.md).

    ``hosts[0]`` is the head (node 0): it hosts torchrun's c10d rendezvous store on ``port``
    and dfo's coordination store on ``port + 1``, holds the run's checkpoints, and decides
    for the whole run. ``gpus`` maps a host to the devices its node uses (one process per
    device; absent: the host's ``gpus.drafter``). ``ifname`` names the interface the nodes
    talk over (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``)."""
    name: str
    hosts: tuple[str, ...]
    head_addr: str
    port: int = 29400
    gpus: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    ifname: str | None = None
    source: str = ""

    @property
    def coord_port(self) -> int:
        return self.port + 1

    @property
    def head(self) -> str:
        return self.hosts[0]


@dataclass
class Inventory:
    hosts: dict[str, HostConfig]
    default: str
    path: Path | None = None
    groups: dict[str, GroupConfig] = field(default_factory=dict)

    def group(self, name: str) -> GroupConfig:
        """The group called ``name`` (``--group NAME``)."""
        if name in self.groups:
            return self.groups[name]
        where = str(self.path) if self.path else "the embedded default inventory"
        if not self.groups and self.path is None:
            raise ConfigError(
                f"--group {name}: the embedded default inventory has one host (local) and no "
                "groups; a group is two or more containers, each a host of a hosts.yaml",
                hint=f"write a hosts.yaml (./hosts.yaml or --hosts FILE) with those hosts and "
                     f"`groups: {{{name}: {{hosts: [A, B], head_addr: ADDR}}}}` "
                     "(docs/multinode.md)")
        if not self.groups:
            raise ConfigError(f"no groups in {where}: add `groups: {{{name}: {{hosts: [A, B], "
                              f"head_addr: ADDR}}}}` (see docs/multinode.md)")
        raise ConfigError(f"unknown group {name!r} in {where}{did_you_mean(name, self.groups)}; "
                          f"known groups: {', '.join(sorted(self.groups))}")

    def get(self, name: str | None) -> HostConfig:
        """The host called ``name``; ``None`` means the default host."""
        if name is None:
            return self.hosts[self.default]
        if name in self.hosts:
            return self.hosts[name]
        where = str(self.path) if self.path else "the embedded default inventory"
        hint = did_you_mean(name, self.hosts)
        known = ", ".join(sorted(self.hosts))
        raise ConfigError(f"unknown host {name!r} in {where}{hint}; known hosts: {known}")
