"""What ``dfo launch --group NAME`` decides before it touches a host. Pure: no I/O.

Each node of a group gets its own ``GroupSpec`` (the ``role`` section of its spec.json):
its index, its process count, its extra env. The run is always the ``ddp`` layout (the
nodes are torchrun's nodes); a ``--set parallel.layout=`` asking for another is refused.
(The members' env fingerprints are compared by ``plan.group_check.env_differences``.)
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..common.errors import (ConfigError, ConnectError, ContainerError, CacheError, DeployError,
                      DfoError, HostKeyError, LockHeldError, NotFoundError, RemoteCommandError,
                      RunFailed)
from ..common.group import GroupSpec
from ..common.launch_argv import trainer_argv

def node_devices(group, host) -> tuple[str, ...]:
    """The devices of ``host``'s node: the group's ``gpus`` for it, else its drafter devices."""
    got = tuple(group.gpus.get(host.name) or ())
    return got or tuple(host.gpus.drafter)


def node_nproc(group, host) -> int:
    """One process per distinct CUDA device; on CPU, one per ``cpu`` the group's ``gpus``
    lists for the node (repeatable), else one."""
    cuda = {d for d in node_devices(group, host) if str(d).startswith("cuda")}
    if cuda:
        return len(cuda)
    return max(1, len(tuple(group.gpus.get(host.name) or ())))


def node_env(group, host) -> dict[str, str]:
    """The extra env of ``host``'s node: the interface the nodes talk over, and the GPUs the
    group gives it (``CUDA_VISIBLE_DEVICES``; its processes then use cuda:0..P-1)."""
    env: dict[str, str] = {}
    if group.ifname:
        env["GLOO_SOCKET_IFNAME"] = group.ifname
        env["NCCL_SOCKET_IFNAME"] = group.ifname
    given = tuple(group.gpus.get(host.name) or ())
    idx = []
    for d in given:
        d = str(d)
        if d.startswith("cuda"):
            n = d.split(":", 1)[1] if ":" in d else "0"
            if n not in idx:
                idx.append(n)
    if idx:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(idx)
    return env


def group_specs(group, hosts: Sequence[Any]) -> list[GroupSpec]:
    """One ``GroupSpec`` per node, the head (``group.hosts[0]``) first; ``hosts`` are the
    members' HostConfigs in the group's order."""
    names = tuple(h.name for h in hosts)
    if names != tuple(group.hosts):
        raise ValueError(f"hosts {names} are not the group's {tuple(group.hosts)}")
    return [GroupSpec(name=group.name, nodes=names, node=i, head_addr=group.head_addr,
                      port=group.port, coord_port=group.coord_port,
                      nproc=node_nproc(group, h), env=node_env(group, h))
            for i, h in enumerate(hosts)]


def group_sets(sets: Sequence[str]) -> list[str]:
    """``--set`` items with ``parallel.layout=ddp`` forced; another layout is a ConfigError."""
    layout = [s.split("=", 1) for s in sets if s.split("=", 1)[0].strip() == "parallel.layout"]
    for _, want in (kv for kv in layout if len(kv) == 2):
        if want.strip().strip("'\"") != "ddp":
            raise ConfigError(f"--set parallel.layout={want}: a group run is always the ddp "
                              "layout", hint="drop that --set; each node runs one process per device")
    return [s for s in sets if not s.split("=", 1)[0].strip() == "parallel.layout"] + \
        ["parallel.layout=ddp"]


_BY_CODE: dict[int, type[DfoError]] = {c.exit_code: c for c in (
    ConfigError, ConnectError, HostKeyError, ContainerError, RemoteCommandError, DeployError,
    CacheError, LockHeldError, RunFailed, NotFoundError)}


def error_class(exit_code: int) -> type[DfoError]:
    """The error class of an exit code (a group command's worst node decides its exit)."""
    return _BY_CODE.get(exit_code, DfoError)


def nodes_error(failures: Sequence[tuple[int, str, str, int]], what: str) -> DfoError:
    """One error for the failing nodes ``(index, host, message, exit_code)``, in node order:
    one line naming each, the first failing node's exit code."""
    parts = [f"node {i} ({h}): {msg}" for i, h, msg, _ in failures]
    code = failures[0][3] if failures else 1
    return error_class(code)(f"{what}: " + "; ".join(parts))


def node_attempt_argv(python: str, config_path: str, overrides: Mapping[str, Any], *,
                      run_dir: str, checkpoint_dir: str, resume: str | None, spec: GroupSpec,
                      run_id: str, attempt: int = 1) -> list[str]:
    """Node ``spec.node``'s torchrun for one attempt (docs/multinode.md): c10d rendezvous on
    the head, a fresh rendezvous id per attempt. Shown by ``--dry-run``; the node's
    supervisor builds the one it runs."""
    single = trainer_argv(python, config_path, overrides, run_dir=run_dir,
                          checkpoint_dir=checkpoint_dir, resume=resume)
    tr = [python, "-m", "torch.distributed.run", "--nnodes", str(spec.nnodes),
          "--nproc-per-node", str(spec.nproc), "--rdzv-backend", "c10d",
          "--rdzv-endpoint", f"{spec.head_addr}:{spec.port}",
          "--rdzv-id", spec.rdzv_id(run_id, attempt), "--max-restarts", "0"]
    if spec.is_head:
        tr += ["--rdzv-conf", "is_host=1"]
    return tr + single[1:]
