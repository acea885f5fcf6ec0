"""Transports: local, ssh, proxmox. See base.Transport.

``open_transport(host)`` picks the implementation by ``host.transport``. SSH-based
transports connect on first use and keep that one connection for the whole invocation.
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol, TypeVar

from ..common.errors import ConfigError
from .base import Result, Transport
from .local import CommandTimeout, LocalTransport

__all__ = ["Result", "Transport", "CommandTimeout", "LocalTransport", "open_transport",
           "run_probe"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class ProbeLike(Protocol[T_co]):
    """What :func:`run_probe` runs: an argv with its timeout and extra env, and the parser
    of the finished command (a plan's ``probes.Probe``)."""

    @property
    def argv(self) -> tuple[str, ...]: ...
    @property
    def timeout(self) -> float: ...
    @property
    def env(self) -> Mapping[str, str] | None: ...
    @property
    def parse(self) -> Callable[[Result], T_co]: ...


def open_transport(host) -> Transport:
    """The transport for ``host`` (not yet connected: SSH connects on first use).

    ``host`` is anything with ``name``, ``transport`` ("local", "ssh" or "proxmox"),
    ``ssh`` (resolved ``SSHSettings``), ``vmid`` and ``source`` (an inventory entry of
    ``orchestrator.config``); transports never read hosts.yaml or ~/.ssh/config."""
    if host.transport == "local":
        return LocalTransport(host.name)
    if host.transport == "ssh":
        from .ssh import SSHTransport

        assert host.ssh is not None
        return SSHTransport(host.name, host.ssh)
    if host.transport == "proxmox":
        from .proxmox import ProxmoxTransport

        assert host.ssh is not None and host.vmid is not None
        return ProxmoxTransport(host.name, host.ssh, host.vmid)
    raise ConfigError(f"{host.source}: hosts.{host.name}.transport: unknown transport {host.transport!r}")


def run_probe(t: Transport, probe: ProbeLike[T]) -> T:
    """Run a probe's argv on ``t`` and parse what came back."""
    env = dict(probe.env) if probe.env else None
    return probe.parse(t.run(list(probe.argv), timeout=probe.timeout, env=env))
