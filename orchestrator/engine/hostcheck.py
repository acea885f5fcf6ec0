"""``dfo hosts check``: judge one host from what its transport answers."""

from __future__ import annotations

from ..config.inventory import HostConfig
from ..errors import ContainerError, DfoError
from ..ops import probes
from ..transport import Transport, run_probe


def check_host(host: HostConfig, t: Transport) -> probes.HostCheck:
    """Everything ``dfo hosts check`` shows: reachability, the container's state, its
    Python, free disk under the root, GPUs and PID 1. Errors a user can cause are
    recorded in the result (``error``/``exit_code``), not raised."""
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
