"""The ``ddp`` layout: one process per GPU under torchrun, DistributedDataParallel drafters.

    torchrun --standalone --nproc-per-node 8 -m trainer train --config run.yaml \
        --parallel.layout ddp
    # multi-node: one per node, same --rdzv-id (the orchestrator launches these)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \
        --rdzv-endpoint HEAD:29400 --rdzv-id RUN -m trainer train --config run.yaml \
        --parallel.layout ddp

Each rank loads the target on its device, runs the target forward for ITS micro-batches
(micro-batch ``i`` of a step belongs to rank ``i % world``; every rank walks the same
deterministic stream, building only its own micro-batches and skipping the others
(``micro_indices``, ``BatchStream.take``), so the data equals the single loop's), and trains
its drafter replica under DDP. The module DDP wraps is the whole drafter step (``_StepModule``), so every
trainable parameter's gradient goes through DDP's reducer; ``no_sync`` for all but the last
local micro-batch. Backend: nccl on GPU, gloo on CPU; ``NCCL_NVLS_ENABLE=0`` is set before
the process group starts. A small gloo group carries the per-step "stop?" vote
(``agree_stop``), so a SIGTERM that reaches the ranks at slightly different times still makes
every rank save and exit at the same step.

The main rank (``main_rank``, ``is_main``) alone writes metrics/markers/checkpoints and alone
reads a checkpoint to resume from (``from_main`` broadcasts the state to the others): on one
node it is global rank 0; in a dfo multi-node run (``DFO_NODE_RANK`` set on every node) it is
local rank 0 of the head node (``DFO_NODE_RANK=0``), wherever the c10d rendezvous placed it
in the global order (``choose_main``, agreed by an all_gather at start). The metrics it logs
are gathered from all ranks (one packed all_gather a step), so the logged loss is the global
one. DDP's bucket size and all-reduce dtype are config (``parallel.ddp_bucket_mb``,
``parallel.ddp_grad_dtype``; ``wrap``).

Devices: ``parallel.drafter_devices: [cpu]`` runs every rank on the CPU (CI); anything else
(``auto``, ``cuda``, ``cuda:N``) means ``cuda:LOCAL_RANK``.
"""

from __future__ import annotations

import contextlib
import logging
import os

from ..core import step as S
from dfo_contract.envvars import NODE_RANK
from dfo_contract.exitcodes import TrainerConfigError
from ..compile.gate import CompileGate, WarmupTask, default_dynamo_settings, describe
from ..core.runtime import Runtime
from .base import LayoutBase

log = logging.getLogger("dfo")


def _step_module_cls():
    import torch

    class _StepModule(torch.nn.Module):
        """What DDP wraps: forward = the drafter step's loss (features, batch) -> (loss, metrics)."""

        def __init__(self, drafter, cfg, rt):
            super().__init__()
            self.drafter = drafter
            self.cfg = cfg
            self.rt = rt

        def forward(self, features, batch):
            return S.drafter_loss(self.drafter, features, batch, self.cfg, self.rt)
    return _StepModule


def rank_device(cfg, local_rank: int, cuda_available: bool) -> str:
    """The device of this rank (pure)."""
    devs = cfg.parallel.drafter_devices
    if all(d == "cpu" for d in devs):
        return "cpu"
    if not cuda_available:
        raise TrainerConfigError("config: --parallel.drafter_devices: ddp on GPU needs CUDA, which "
                                 "is not available here; use [cpu]")
    return f"cuda:{local_rank}"


def my_indices(n_micro: int, rank: int, world: int) -> list[int]:
    """Micro-batch indices of one step that belong to ``rank`` (pure)."""
    return [i for i in range(n_micro) if i % world == rank]


def choose_main(ranks: list[tuple[int | None, int]]) -> int:
    """The main rank, given each global rank's ``(DFO_NODE_RANK or None, LOCAL_RANK)`` (pure).

    Without DFO_NODE_RANK anywhere: rank 0 (one node). Otherwise the one rank with node 0,
    local rank 0; none, several, or DFO_NODE_RANK set on only some ranks is a config error."""
    if all(n is None for n, _ in ranks):
        return 0
    unset = [r for r, (n, _) in enumerate(ranks) if n is None]
    if unset:
        raise TrainerConfigError(f"ddp: {NODE_RANK} is set on some ranks but not on ranks "
                                 f"{unset}; set it on every node (0 on the head node)")
    heads = [r for r, (n, lr) in enumerate(ranks) if n == 0 and lr == 0]
    if len(heads) != 1:
        raise TrainerConfigError(f"ddp: {len(heads)} ranks have {NODE_RANK}=0 and LOCAL_RANK=0 "
                                 f"(ranks {heads}); give exactly one node {NODE_RANK}=0 (the head)")
    return heads[0]


class DdpLayout(LayoutBase):
    name = "ddp"

    def __init__(self, cfg, rt: Runtime | None = None, *, build_target=None):
        """``rt``: the process's runtime, whose ``env`` gives torchrun's ranks and
        ``DFO_NODE_RANK`` (None: one of its own, the environment read now).
        ``build_target(device) -> Target``: a target built in memory (bench/bench_ddp.py);
        None loads ``model.target_path`` as training does."""
        import torch
        import torch.distributed as dist

        self.rt = rt = rt if rt is not None else Runtime.create()
        env = rt.env
        if not env.under_torchrun:
            raise TrainerConfigError(
                "config: --parallel.layout: ddp must be started by torchrun, e.g. torchrun "
                "--standalone --nproc-per-node N -m trainer train --config FILE --parallel.layout ddp")
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        self.cfg = cfg
        dev = rank_device(cfg, env.local_rank, torch.cuda.is_available())
        self.device = torch.device(dev)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._own_pg = not dist.is_initialized()
        if self._own_pg:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # control plane on the CPU (gloo): agreeing to stop costs no GPU synchronization
        self._ctl = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
        # parallel.warmup_sync_s: the ranks meet after their warm-up, on the CPU, with a
        # timeout a cold compile fits in, before the first NCCL collective
        self._sync = None
        if cfg.parallel.warmup_sync_s:
            from datetime import timedelta

            self._sync = dist.new_group(backend="gloo",
                                        timeout=timedelta(seconds=cfg.parallel.warmup_sync_s))
        self.main_rank = self._agree_main(env)
        self.is_main = self.rank == self.main_rank
        self.data_parallel = self.world
        self.target, self.drafter = S.build_models(
            cfg, self.device, target=build_target(self.device) if build_target else None, rt=rt)
        self.uses_compiled = S.uses_compiled(cfg, [self.drafter])
        self.gate = rt.compile.install_gate(CompileGate(
            enabled=cfg.compile.gate, settings=default_dynamo_settings(S.compile_variants(cfg, 1, 1)),
            cache=rt.compile.cache))
        self.gate.thread_setup()
        self.module = _step_module_cls()(self.drafter, cfg, rt)
        self.ddp = self.wrap(cfg.parallel.ddp_bucket_mb, cfg.parallel.ddp_grad_dtype)

    def wrap(self, bucket_mb: int, grad_dtype: str):
        """The DDP wrapper of the step module: ``bucket_mb`` (DDP's bucket_cap_mb) and the
        all-reduce dtype (``bf16``: torch's bf16 compression hook; the averaged gradient is
        rounded to bf16 before it lands in fp32 ``.grad``). ``gradient_as_bucket_view``:
        ``.grad`` are views into DDP's buckets (no copy per step). The bench re-wraps to
        compare settings in one process."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        if grad_dtype == "bf16" and self.device.type != "cuda":
            raise TrainerConfigError("config: --parallel.ddp_grad_dtype: bf16 gradients need "
                                     "NCCL (ddp on GPU); use fp32 with gloo on CPU")
        ddp = DDP(self.module, device_ids=[self.device.index] if self.device.type == "cuda"
                  else None, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
        if grad_dtype == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        return ddp

    def parameters(self):
        return self.drafter.trainable_parameters()

    def warmup(self, emitter, heartbeat_s: float) -> list[dict]:
        """Each rank warms its own device (every bucket, fwd+bwd, outside DDP), then seals;
        with ``parallel.warmup_sync_s`` the ranks then meet before the first collective."""
        recs = self._warmup(emitter, heartbeat_s)
        if self._sync is not None:
            import torch.distributed as dist

            emitter.print(f"trainer: rank {self.rank} warmed up; meeting the other ranks "
                          f"(timeout {self.cfg.parallel.warmup_sync_s} s)")
            dist.barrier(group=self._sync)
        return recs

    def _warmup(self, emitter, heartbeat_s: float) -> list[dict]:
        if not (self.uses_compiled and self.gate.enabled):
            return []
        from ..telemetry import metrics

        emitter.set_phase("warmup")
        cfg, dev, dr = self.cfg, self.device, self.drafter

        def task(shape):
            def run():
                b = S.dummy_batch(cfg, shape[0], shape[1], cfg.train.micro_batch, dev)
                feats = S.target_features(self.target, b, cfg)
                loss, _ = S.drafter_loss(dr, feats, b, cfg, self.rt)
                loss.backward()
                dr.zero_grad(set_to_none=True)
            return WarmupTask(device=str(dev), shape=tuple(shape), run=run,
                              what=S.warmup_what(cfg, f"drafter step (rank {self.rank})"))
        recs = self.gate.warmup([task(s) for s in S.shape_buckets(cfg)],
                                heartbeat=metrics.Heartbeat(emitter, every_s=heartbeat_s),
                                on_record=lambda rec: emitter.print(describe(rec)))
        self.gate.seal()
        return [r.to_json() for r in recs]

    def micro_indices(self, n_micro: int) -> list[int]:
        return my_indices(n_micro, self.rank, self.world)

    def grads(self, batches, loss_hook=None) -> list[dict]:
        """This rank's micro-batches (the others may be ``SkippedBatch``) forward + backward;
        every rank's metrics come back in the step's order (one all_gather)."""
        mine = my_indices(len(batches), self.rank, self.world)
        n = len(mine)
        local = []
        for k, i in enumerate(mine):
            b = batches[i].to(self.device, non_blocking=True)
            self.gate.check_shape(str(self.device), b.shape)
            feats = S.target_features(self.target, b, self.cfg)
            sync = contextlib.nullcontext() if k == n - 1 else self.ddp.no_sync()
            with sync:
                loss, m = self.ddp(feats, b)
                if loss_hook is not None:
                    loss = loss_hook(loss)
                    m["loss"] = loss.detach()
                with self.gate.guard("drafter backward"):
                    (loss / n).backward()
            local.append(m)
        return self._gather(local, len(batches))

    def _gather(self, local: list[dict], n_micro: int) -> list[dict]:
        """All ranks' metric dicts, in the step's micro-batch order (as the single loop has):
        every value of every local micro-batch packed into one fp32 vector, ONE all_gather."""
        import torch
        import torch.distributed as dist

        flat = pack_metrics(local)
        bufs = [torch.empty_like(flat) for _ in range(self.world)]
        dist.all_gather(bufs, flat)
        out: list[dict | None] = [None] * n_micro
        for r in range(self.world):
            got = unpack_metrics(bufs[r], local)
            for k, i in enumerate(my_indices(n_micro, r, self.world)):
                out[i] = got[k]
        full = [o for o in out if o is not None]
        if len(full) != n_micro:
            raise RuntimeError(f"ddp: the metrics of micro-batches "
                               f"{[i for i, o in enumerate(out) if o is None]} came from no rank")
        return full

    def before_save(self) -> None:
        """DDP keeps replicas identical by construction; check it cheaply (a checksum)."""
        import torch
        import torch.distributed as dist

        from .replicas import ReplicaDivergence

        with torch.no_grad():
            s = torch.stack([p.detach().double().sum() for p in self.parameters()]).sum()
            s = s.reshape(1).to(self.device)
            lo, hi = s.clone(), s.clone()
            dist.all_reduce(lo, op=dist.ReduceOp.MIN)
            dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        if lo.item() != hi.item():
            raise ReplicaDivergence(f"ddp: drafter replicas differ across ranks (parameter "
                                    f"checksums {lo.item()!r} .. {hi.item()!r})")

    def _agree_main(self, env) -> int:
        """Every rank's (node rank, local rank) gathered on the control group -> main rank."""
        import torch
        import torch.distributed as dist

        mine = torch.tensor([-1 if env.node_rank is None else env.node_rank, env.local_rank],
                            dtype=torch.int64)
        bufs = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(bufs, mine, group=self._ctl)
        return choose_main([(None if int(b[0]) < 0 else int(b[0]), int(b[1])) for b in bufs])

    def from_main(self, value):
        """``value`` of the main rank on every rank: its structure (small) by
        broadcast_object_list on the gloo control group, then each tensor by broadcast on
        the default group (nccl on GPU) from this rank's device; CPU tensors come back to the
        CPU. The main rank gets its own ``value`` back."""
        import torch
        import torch.distributed as dist

        me = self.rank == self.main_rank
        tensors: list = []
        box = [_strip(value, tensors) if me else None]
        dist.broadcast_object_list(box, src=self.main_rank, group=self._ctl)
        specs: list[_TensorSpec] = []
        _specs(box[0], specs)
        got = []
        for i, spec in enumerate(specs):
            if me:
                buf = tensors[i].detach().to(self.device).contiguous()
            else:
                buf = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device=self.device)
            dist.broadcast(buf, src=self.main_rank)
            got.append(buf.cpu() if spec.cpu else buf)
        return value if me else _fill(box[0], got)

    def agree_stop(self, local: bool) -> bool:
        """True on every rank when any rank got SIGTERM/SIGINT (so all save and stop together)."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if local else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._ctl)
        return bool(flag.item())

    def compiled_call(self):
        return self.rt.compile.run_probe

    def close(self) -> None:
        """Tear down the process group this layout made. The DDP wrapper goes first (its
        reducer and comm hooks hold the group); on a normal end every rank then meets at a
        barrier, so no rank destroys the group while a peer's gloo threads still use it
        (torch aborts with ``terminate called without an active exception``). While an
        exception propagates (a peer may be gone) there is no barrier."""
        import gc
        import sys
        from datetime import timedelta

        import torch.distributed as dist

        self.gate.unseal()
        if self._own_pg and dist.is_initialized():
            self.ddp = None
            gc.collect()
            if sys.exc_info()[0] is None and self.world > 1:
                try:
                    dist.monitored_barrier(group=self._ctl, timeout=timedelta(seconds=60))
                except RuntimeError:   # a peer that ended otherwise: tear down all the same
                    pass
            dist.destroy_process_group()


class _TensorSpec:
    """A tensor's place in a ``from_main`` structure: index, shape, dtype, CPU or device."""

    def __init__(self, index: int, shape: tuple, dtype: str, cpu: bool):
        self.index, self.shape, self.dtype, self.cpu = index, shape, dtype, cpu


def _strip(v, out: list):
    """``v`` with every tensor replaced by a ``_TensorSpec`` (the tensors appended to ``out``)."""
    import torch

    if isinstance(v, torch.Tensor):
        out.append(v)
        return _TensorSpec(len(out) - 1, tuple(v.shape), str(v.dtype).removeprefix("torch."),
                           v.device.type == "cpu")
    if isinstance(v, dict):
        return {k: _strip(x, out) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_strip(x, out) for x in v)
    return v


def _specs(v, out: list) -> None:
    if isinstance(v, _TensorSpec):
        out.append(v)
    elif isinstance(v, dict):
        for x in v.values():
            _specs(x, out)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _specs(x, out)


def _fill(v, tensors: list):
    if isinstance(v, _TensorSpec):
        return tensors[v.index]
    if isinstance(v, dict):
        return {k: _fill(x, tensors) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_fill(x, tensors) for x in v)
    return v


def pack_metrics(local: list[dict]):
    """One fp32 vector of every micro-batch's metric tensors (keys sorted, micro-batch order)."""
    import torch

    keys = sorted(local[0])
    return torch.cat([m[key].detach().float().reshape(-1) for m in local for key in keys])


def unpack_metrics(flat, like: list[dict]) -> list[dict]:
    """``pack_metrics``'s inverse: ``len(like)`` dicts shaped (and typed) as ``like``'s."""
    keys = sorted(like[0])
    out, at = [], 0
    for m in like:
        d = {}
        for key in keys:
            n = m[key].numel()
            d[key] = flat[at:at + n].reshape(m[key].shape).to(m[key].dtype)
            at += n
        out.append(d)
    return out
