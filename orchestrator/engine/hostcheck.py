"""``dfo hosts check``: judge one host from what its transport answers."""

from __future__ import annotations

from ..config.inventory import HostConfig
from ..common.errors import ContainerError, DfoError
from ..plan import gpu, probes
from ..plan.gpu_judge import gpu_problems
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
        check.gpu = gpu_facts(t)
        check.gpus = gpu.gpu_report(check.gpu.query)
        check.init = run_probe(t, probes.init_probe())
        profile, cuda, lock_problem = _profile_cuda(host.profile)
        check.gpu.problems = gpu_problems(check.gpu, profile=profile, cuda_runtime=cuda,
                                          vmid=host.vmid if host.transport == "proxmox" else None)
        if lock_problem:
            check.gpu.problems.append(lock_problem)
    except DfoError as e:
        check.error = str(e)
        check.exit_code = e.exit_code
        if isinstance(e, ContainerError):  # the node answered; the container is the problem
            check.reachable = True
            check.container = check.container or "missing"
            check.problems.append(str(e))
            return check
    return probes.judge(check)


def gpu_facts(t: Transport) -> gpu.GpuFacts:
    """One probe per fact: the driver's own view first; nvidia-smi only where it exists."""
    f = gpu.GpuFacts()
    f.driver = run_probe(t, gpu.driver_probe())
    f.devnodes = run_probe(t, gpu.devnodes_probe())
    f.query = run_probe(t, gpu.query_probe())
    if f.query.present:
        f.smi = run_probe(t, gpu.smi_probe())
        apps = run_probe(t, gpu.apps_probe())
        f.apps = apps or ()
    f.shm = run_probe(t, gpu.shm_probe())
    f.memlock_known, f.memlock_kib = run_probe(t, gpu.memlock_probe())
    return f


def _profile_cuda(name: str) -> tuple[str, str | None, str | None]:
    """The host's profile, the CUDA runtime it needs (None: a profile that runs on the CPU,
    ``expect.cuda_available`` not true, whatever CUDA its torch was built against; or not
    loadable here), and why ``dfo deploy`` could not use it (e.g. a profile without its
    lock), if so."""
    from ..config.profiles import load_profile

    try:
        prof = load_profile(name)
    except DfoError as e:
        return name, None, str(e)
    cuda = prof.expect.get("torch_cuda")
    problem = None
    try:
        prof.lock_bytes()  # a missing lock: the one-line error with the command that makes it
    except DfoError as e:
        problem = str(e)
    needs_gpu = prof.expect.get("cuda_available") is True
    return name, (str(cuda) if cuda and needs_gpu else None), problem
