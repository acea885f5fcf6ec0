"""The ``ddp`` layout: one process per GPU under torchrun, DistributedDataParallel drafters.

    torchrun --standalone --nproc-per-node 8 -m trainer train --config run.yaml \
        --parallel.layout ddp
    # multi-node: one per node, same --rdzv-id (the orchestrator launches these)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \
        --rdzv-endpoint HEAD:29400 --rdzv-id RUN -m trainer train --config run.yaml \
        --parallel.layout ddp

Each rank loads the target on its device, runs the target forward for ITS micro-batches
(micro-batch ``i`` of a step belongs to rank ``i % world``; every rank draws the same
deterministic stream, so the data equals the single loop's), and trains its drafter replica
under DDP. The module DDP wraps is the whole drafter step (``_StepModule``), so every
trainable parameter's gradient goes through DDP's reducer; ``no_sync`` for all but the last
local micro-batch. Backend: nccl on GPU, gloo on CPU; ``NCCL_NVLS_ENABLE=0`` is set before
the process group starts. A small gloo group carries the per-step "stop?" vote
(``agree_stop``), so a SIGTERM that reaches the ranks at slightly different times still makes
every rank save and exit at the same step. Only rank 0 writes metrics/markers/checkpoints (``is_main``); the
metrics it logs are gathered from all ranks, so the logged loss is the global one.

Devices: ``parallel.drafter_devices: [cpu]`` runs every rank on the CPU (CI); anything else
(``auto``, ``cuda``, ``cuda:N``) means ``cuda:LOCAL_RANK``.
"""

from __future__ import annotations

import contextlib
import logging
import os

from .. import runtime, step as S
from dfo_contract.exitcodes import TrainerConfigError
from ..gate import CompileGate, WarmupTask, default_dynamo_settings, describe, install
from .base import LayoutBase

log = logging.getLogger("dfo")


def _step_module_cls():
    import torch

    class _StepModule(torch.nn.Module):
        """What DDP wraps: forward = the drafter step's loss (features, batch) -> (loss, metrics)."""

        def __init__(self, drafter, cfg):
            super().__init__()
            self.drafter = drafter
            self.cfg = cfg

        def forward(self, features, batch):
            return S.drafter_loss(self.drafter, features, batch, self.cfg)
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


class DdpLayout(LayoutBase):
    name = "ddp"

    def __init__(self, cfg):
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        env = runtime.get().env
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
        self.is_main = self.rank == 0
        self.data_parallel = self.world
        self.target, self.drafter = S.build_models(cfg, self.device)
        self.uses_compiled = cfg.compile.enabled or self.drafter.attn_backend == "flex"
        self.gate = install(CompileGate(enabled=cfg.compile.gate, settings=default_dynamo_settings(
            len(S.shape_buckets(cfg)))))
        self.gate.thread_setup()
        self.module = _step_module_cls()(self.drafter, cfg)
        self.ddp = DDP(self.module, device_ids=[self.device.index] if self.device.type == "cuda"
                       else None)

    def parameters(self):
        return self.drafter.trainable_parameters()

    def warmup(self, emitter, heartbeat_s: float) -> list[dict]:
        """Each rank warms its own device (every bucket, fwd+bwd, outside DDP), then seals."""
        if not (self.uses_compiled and self.gate.enabled):
            return []
        from .. import metrics

        emitter.set_phase("warmup")
        cfg, dev, dr = self.cfg, self.device, self.drafter

        def task(shape):
            def run():
                b = S.dummy_batch(cfg, shape[0], shape[1], cfg.train.micro_batch, dev)
                feats = S.target_features(self.target, b, cfg)
                loss, _ = S.drafter_loss(dr, feats, b, cfg)
                loss.backward()
                dr.zero_grad(set_to_none=True)
            return WarmupTask(device=str(dev), shape=tuple(shape), run=run,
                              what=f"drafter step (rank {self.rank})")
        recs = self.gate.warmup([task(s) for s in S.shape_buckets(cfg)],
                                heartbeat=metrics.Heartbeat(emitter, every_s=heartbeat_s),
                                on_record=lambda rec: emitter.print(describe(rec)))
        self.gate.seal()
        return [r.to_json() for r in recs]

    def grads(self, batches, loss_hook=None) -> list[dict]:
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
        """All ranks' metric dicts, in the step's micro-batch order (as the single loop has)."""
        import torch
        import torch.distributed as dist

        keys = sorted(local[0])
        out: list[dict | None] = [None] * n_micro
        per_key = {}
        for key in keys:
            t = torch.stack([m[key].detach().float().reshape(-1) for m in local])  # [n, ...]
            bufs = [torch.empty_like(t) for _ in range(self.world)]
            dist.all_gather(bufs, t.contiguous())
            per_key[key] = bufs
        for r in range(self.world):
            for k, i in enumerate(my_indices(n_micro, r, self.world)):
                out[i] = {key: _unflat(per_key[key][r][k], local[0][key])
                          for key in keys}
        return out

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

    def agree_stop(self, local: bool) -> bool:
        """True on every rank when any rank got SIGTERM/SIGINT (so all save and stop together)."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if local else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._ctl)
        return bool(flag.item())

    def compiled_call(self):
        from .threads import _probe

        return _probe

    def close(self) -> None:
        import torch.distributed as dist

        self.gate.unseal()
        if self._own_pg and dist.is_initialized():
            dist.destroy_process_group()


def _unflat(v, like):
    return v.reshape(like.shape).to(like.dtype) if hasattr(like, "shape") else v
