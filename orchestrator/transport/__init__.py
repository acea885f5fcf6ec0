"""Transports: local, ssh, proxmox. See base.Transport.

``open_transport(host)`` picks the implementation by ``host.transport``. SSH-based
transports connect on first use and keep that one connection for the whole invocation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from ..errors import ConfigError, ContainerError, DfoError
from .base import Result, Transport
from .local import CommandTimeout, LocalTransport

if TYPE_CHECKING:  # pragma: no cover
    from ..hosts import HostConfig
    from ..ops.probes import HostCheck, Probe

__all__ = ["Result", "Transport", "CommandTimeout", "LocalTransport", "open_transport",
           "run_probe", "check_host"]

T = TypeVar("T")


def open_transport(host: "HostConfig") -> Transport:
    """The transport for ``host`` (not yet connected: SSH connects on first use)."""
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


def run_probe(t: Transport, probe: "Probe[T]") -> T:
    """Run a probe's argv on ``t`` and parse what came back."""
    kw = {"env": dict(probe.env)} if probe.env else {}
    return probe.parse(t.run(list(probe.argv), timeout=probe.timeout, **kw))


def check_host(host: "HostConfig", t: Transport) -> "HostCheck":
    """Everything ``dfo hosts check`` shows: reachability, the container's state, its
    Python, free disk under the root, GPUs and PID 1. Errors a user can cause are
    recorded in the result (``error``/``exit_code``), not raised."""
    from ..ops import probes

    check = probes.HostCheck(host=host.name, transport=host.transport, target=host.describe(),
                             root=host.root)
    try:
        if host.transport == "proxmox":
            check.container = t.container_status()  # type: ignore[attr-defined]
            check.reachable = True
            if check.container != "running":
                check.exit_code = 5  # ContainerError
                return probes.judge(check)
        check.kernel = run_probe(t, probes.kernel_probe())
        check.reachable = True
        check.python = run_probe(t, probes.python_probe(host.python))
        check.disk = run_probe(t, probes.disk_probe(host.root))
        check.gpus = run_probe(t, probes.gpu_probe())
        check.init = run_probe(t, probes.init_probe())
    except DfoError as e:
        check.error = str(e)
        check.exit_code = e.exit_code
        if isinstance(e, ContainerError):  # the node answered; the container is the problem
            check.reachable = True
            check.container = check.container or "missing"
            check.problems.append(str(e))
            return check
    return probes.judge(check)
