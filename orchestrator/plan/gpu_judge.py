"""Judge a target's GPU facts (``plan/gpu.py``): one line per problem, each with its fix (pure)."""

from __future__ import annotations

from .gpu import BUSY_MIB, MIN_DRIVER, MIN_MEMLOCK_KIB, MIN_SHM_BYTES, GpuFacts

#: the profile ``dfo hosts check`` suggests for a GPU host (its lock resolves from PyPI)
DEFAULT_GPU_PROFILE = "gpu-cu130"
#: the character device major of /dev/nvidia0..N and /dev/nvidiactl (fixed by the driver)
NVIDIA_MAJOR = 195


def _vtuple(v: str) -> tuple[int, ...]:
    out = []
    for p in v.split("."):
        if not p.isdigit():
            break
        out.append(int(p))
    return tuple(out)


def _conf(vmid: int | None) -> str:
    return f"/etc/pve/lxc/{vmid if vmid is not None else '<vmid>'}.conf on the node"


def _restart(vmid: int | None) -> str:
    return f"then `pct reboot {vmid if vmid is not None else '<vmid>'}`"


def settle(f: GpuFacts) -> GpuFacts:
    """Fill ``present``, ``driver_version`` and ``max_cuda`` from the individual probes."""
    q, smi, drv, dev = f.query, f.smi, f.driver, f.devnodes
    f.present = bool((q and q.gpus) or (drv and drv.kernel) or (dev and dev.expected_gpus)
                     or (dev and any(n.state != "missing" for n in dev.nodes)))
    f.driver_version = ((drv.kernel if drv else None) or (smi.driver if smi else None)
                        or next((g.driver for g in (q.gpus if q else ()) if g.driver), None))
    f.max_cuda = smi.cuda if smi else None
    return f


def gpu_problems(f: GpuFacts, *, profile: str | None, cuda_runtime: str | None,
                 vmid: int | None = None) -> list[str]:
    """Problems for a target whose env uses ``profile`` (needing CUDA ``cuda_runtime``,
    the profile's ``expect.torch_cuda``; None for a CPU profile). ``vmid``: the container,
    to name its config file in the fixes."""
    settle(f)
    p: list[str] = []
    if not f.present:
        if cuda_runtime:
            p.append(f"no NVIDIA GPU is visible (no /proc/driver/nvidia, no nvidia-smi) but profile "
                     f"{profile} needs CUDA {cuda_runtime} (install the NVIDIA driver on the node and "
                     "pass the GPUs through to the container: docs/hosts.md, GPU passthrough)")
        return p
    dev = f.devnodes
    if dev:
        missing = [n.path for n in dev.nodes if n.state == "missing"]
        if missing:
            lines = "; ".join(f"`lxc.mount.entry: {m} {m[1:]} none bind,optional,create=file`"
                              for m in missing)
            p.append(f"GPU device node(s) missing in the container: {', '.join(missing)} "
                     f"(add to {_conf(vmid)}: {lines}, {_restart(vmid)})")
        refused = [n for n in dev.nodes if n.state == "denied"]
        perms = [n for n in refused if "permission denied" in n.detail.lower()]
        denied = [n for n in refused if n not in perms]  # EPERM: the cgroup device rules
        if perms:
            p.append(f"GPU device node(s) not readable by this user: {', '.join(n.path for n in perms)} "
                     "(Permission denied) (run dfo's commands as root in the container, or make the "
                     "nodes mode 0666 on the node: the NVIDIA driver's default)")
        if denied:
            majors = sorted({n.major if n.major is not None else NVIDIA_MAJOR for n in denied})
            allow = "; ".join(f"`lxc.cgroup2.devices.allow: c {m}:* rwm`" for m in majors)
            why = denied[0].detail.split(":")[-1].strip() or "Operation not permitted"
            p.append(f"GPU device node(s) not allowed by the container's cgroup device rules: "
                     f"{', '.join(n.path for n in denied)} ({why}) "
                     f"(add to {_conf(vmid)}: {allow}, {_restart(vmid)})")
    drv = f.driver
    mismatch_text = any("version mismatch" in (e or "").lower()
                        for e in ((f.query.error if f.query else None), (f.smi.error if f.smi else None)))
    libs = sorted({v for _, v in drv.libraries}) if drv else []
    if drv and drv.kernel and (any(v != drv.kernel for v in libs) or mismatch_text):
        other = [v for v in libs if v != drv.kernel]
        libtxt = ", ".join(other) if other else "a different version"
        p.append(f"NVML driver/library version mismatch: the node's kernel module is {drv.kernel}, the "
                 f"container's libnvidia-ml is {libtxt} (install the user-space driver {drv.kernel} in the "
                 f"container, e.g. `sh NVIDIA-Linux-x86_64-{drv.kernel}.run --no-kernel-module`, "
                 "or the distribution package of exactly that version)")
    elif drv and drv.kernel and not libs and not (f.query and f.query.present):
        p.append(f"the NVIDIA user-space driver is not installed in the container (no libnvidia-ml, no "
                 f"nvidia-smi; the node's kernel module is {drv.kernel}) (install exactly that version's "
                 f"user-space part: `sh NVIDIA-Linux-x86_64-{drv.kernel}.run --no-kernel-module`)")
    elif mismatch_text:
        p.append("NVML driver/library version mismatch (the container's NVIDIA libraries differ from the "
                 "node's kernel module: install the same driver version in both)")
    elif f.query and f.query.error and not (dev and any(n.state != "ok" for n in dev.nodes)):
        p.append(f"nvidia-smi failed: {f.query.error}")
    need = MIN_DRIVER.get(cuda_runtime or "")
    have = _vtuple(f.driver_version or "")
    if cuda_runtime and have and need and have[0] < need:
        alt = next((name for name, cu in (("gpu-cu128", "12.8"),) if MIN_DRIVER[cu] <= have[0]), None)
        p.append(f"profile {profile} needs CUDA {cuda_runtime}, which needs NVIDIA driver >= {need}; "
                 f"the node has {f.driver_version} (upgrade the node's driver and the container's "
                 f"libraries to {need} or newer" + (f", or use profile {alt}" if alt else "") + ")")
    elif cuda_runtime and f.max_cuda and _vtuple(f.max_cuda) < _vtuple(cuda_runtime):
        p.append(f"profile {profile} needs CUDA {cuda_runtime}; the driver {f.driver_version or ''} runs "
                 f"CUDA <= {f.max_cuda} (upgrade the node's NVIDIA driver)")
    if f.query:
        for g in f.query.gpus:
            apps = [a for a in f.apps if a.gpu_uuid == g.uuid]
            used = g.memory_used_mib or 0
            if apps or used > BUSY_MIB:
                who = ", ".join(f"{a.name} pid {a.pid}" for a in apps[:3])
                p.append(f"GPU {g.index} ({g.name}) is busy: "
                         + (f"{len(apps)} process(es) ({who}), " if apps else "")
                         + f"{used} of {g.memory_mib} MiB in use (stop what runs there, or leave "
                           f"cuda:{g.index} out of gpus: in hosts.yaml)")
    count = len(f.query.gpus) if f.query and f.query.gpus else (dev.expected_gpus if dev else 0)
    if f.shm and count > 1 and f.shm.total_bytes < MIN_SHM_BYTES:
        p.append(f"/dev/shm is {f.shm.total_bytes // 2**20} MiB, too small for NCCL with {count} GPUs "
                 "(give it >= 1 GiB: `mount -o remount,size=16G /dev/shm` in the container; to keep it, "
                 f"`lxc.mount.entry: tmpfs dev/shm tmpfs size=16G,nosuid,nodev,create=dir 0 0` in "
                 f"{_conf(vmid)})")
    if f.memlock_known and f.memlock_kib is not None and f.memlock_kib < MIN_MEMLOCK_KIB:
        p.append(f"memlock ulimit is {f.memlock_kib} KiB; NCCL and pinned memory need it unlimited "
                 f"(add `lxc.prlimit.memlock: unlimited` to {_conf(vmid)}, {_restart(vmid)})")
    if not cuda_runtime and (f.query and f.query.gpus):
        p.append(f"the host has GPUs but its profile {profile} is CPU-only (set "
                 f"`profile: {DEFAULT_GPU_PROFILE}` in hosts.yaml, then `dfo deploy`)")
    return p
