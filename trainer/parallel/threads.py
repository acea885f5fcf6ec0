"""The ``threads`` layout: one process, T target devices + D drafter devices, a thread each.

Compatible with the setup of the threaded lazy-compile race (docs/recovery.md: 5 target +
3 drafter GPUs in one process), made safe
by the compile gate (trainer.compile.gate): every compiled shape is warmed on every drafter replica
before any worker starts, then compiling is forbidden and compiled calls are serialized by
the gate's lock. ``compile.gate: false`` reproduces the race's unguarded pattern.

Replicas: drafter replica 0 is the one the loop's optimizer steps and checkpoints save.
Each step every replica computes gradients on its micro-batches; the gradients are averaged
across replicas (fp32, fixed order); the optimizer steps replica 0; ``after_step`` copies
replica 0's parameters into the others (one optimizer state, not D). ``before_save`` checks
that all replicas hold identical parameters.
"""

from __future__ import annotations

import logging

from ..core import step as S
from ..compile.gate import CompileGate, WarmupTask, default_dynamo_settings, describe
from ..core.runtime import Runtime
from ..model.target import load_target
from . import replicas
from .base import LayoutBase
from .workers import StepFns, ThreadedEngine

log = logging.getLogger("dfo")


class ThreadsLayout(LayoutBase):
    name = "threads"

    def __init__(self, cfg, rt: Runtime | None = None):
        """``rt``: the process's runtime (None: one of its own)."""
        self.cfg = cfg
        self.rt = rt = rt if rt is not None else Runtime.create()
        p = cfg.parallel
        self.target_devices = [S.resolve_device(d) for d in p.target_devices]
        self.drafter_devices = [S.resolve_device(d) for d in p.drafter_devices]
        self.data_parallel = len(self.drafter_devices)
        # one Target per entry: a Target captures tapped states on itself (not shareable by threads)
        self.targets = [
            load_target(cfg.model.target_path, device=d, dtype=S.compute_dtype(cfg, d),
                        num_drafter_layers=cfg.model.drafter_layers,
                        tap_ids=cfg.model.target_layer_ids)
            for d in self.target_devices]
        for t in self.targets:  # fp8, compile.target: every target's layers (warmed below)
            S.prepare_target(cfg, t, rt)
        self.drafters = []
        for r, d in enumerate(self.drafter_devices):
            _, dr = S.build_models(cfg, d, target=self.targets[r % len(self.targets)], rt=rt)
            self.drafters.append(dr)
        replicas.broadcast_params(self.drafters)
        self.target, self.drafter, self.device = self.targets[0], self.drafters[0], \
            self.drafter_devices[0]
        self.uses_compiled = S.uses_compiled(cfg, self.drafters)
        n_variants = S.compile_variants(cfg, len(self.drafters), len(self.targets))
        self.gate = rt.compile.install_gate(CompileGate(
            enabled=cfg.compile.gate, settings=default_dynamo_settings(n_variants),
            cache=rt.compile.cache))
        self.gate.thread_setup()
        fns = StepFns(target_features=lambda t, b: S.target_features(t, b, cfg),
                      drafter_loss=lambda d, f, b: S.drafter_loss(d, f, b, cfg, rt),
                      to_device=lambda b, dev: b.to(dev, non_blocking=True))
        self.engine = ThreadedEngine(
            targets=[(str(d), t) for d, t in zip(self.target_devices, self.targets, strict=True)],
            drafters=[(str(d), m) for d, m in zip(self.drafter_devices, self.drafters, strict=True)],
            fns=fns, gate=self.gate, grad_accum=cfg.train.grad_accum,
            queue_depth=p.queue_depth)
        self._started = False

    # -- the loop's layout protocol -----------------------------------------------------------
    def parameters(self):
        return self.drafter.trainable_parameters()

    def warmup(self, emitter, heartbeat_s: float) -> list[dict]:
        """Gate on: every replica x bucket, fwd+bwd, sequentially in this thread; then seal.

        Gate off: nothing (the race's lazy compile on first use in each worker).
        """
        replicas.broadcast_params(self.drafters)  # e.g. after a resume loaded replica 0
        if not (self.uses_compiled and self.gate.enabled):
            return []
        from ..telemetry import metrics

        emitter.set_phase("warmup")
        tasks = []
        for r, (dev, dr) in enumerate(zip(self.drafter_devices, self.drafters, strict=True)):
            tgt = self.targets[r % len(self.targets)]
            for shape in S.shape_buckets(self.cfg):
                tasks.append(self._task(dev, tuple(shape), tgt, dr, r))
        for t in range(len(self.drafters), len(self.targets)):  # targets no replica reaches
            if self.targets[t].compiled_layers:
                tasks += [self._target_task(t, tuple(s)) for s in S.shape_buckets(self.cfg)]
        recs = self.gate.warmup(tasks, heartbeat=metrics.Heartbeat(emitter, every_s=heartbeat_s),
                                on_record=lambda rec: emitter.print(describe(rec)))
        self.gate.seal()
        return [r.to_json() for r in recs]

    def _task(self, dev, shape, tgt, dr, r) -> WarmupTask:
        cfg = self.cfg

        def run():
            b = S.dummy_batch(cfg, shape[0], shape[1], cfg.train.micro_batch, dev)
            feats = S.target_features(tgt, b, cfg).to(dev)
            loss, _ = S.drafter_loss(dr, feats, b, cfg, self.rt)
            loss.backward()
            dr.zero_grad(set_to_none=True)
        return WarmupTask(device=str(dev), shape=shape, run=run,
                          what=S.warmup_what(cfg, f"drafter replica {r}"))

    def _target_task(self, t: int, shape) -> WarmupTask:
        """The target forward alone, for a target worker that no drafter replica's task uses."""
        cfg, tgt, dev = self.cfg, self.targets[t], self.target_devices[t]

        def run():
            S.target_features(tgt, S.dummy_batch(cfg, shape[0], shape[1], cfg.train.micro_batch,
                                                 dev), cfg)
        return WarmupTask(device=str(dev), shape=shape, run=run, what=f"target layers {t}")

    def grads(self, batches, loss_hook=None) -> list[dict]:
        if not self._started:
            replicas.broadcast_params(self.drafters)
            self.engine.start()
            self._started = True
        for i, b in enumerate(batches):
            self.gate.check_shape(str(self.drafter_devices[i % self.data_parallel]), b.shape)
        for dr in self.drafters[1:]:
            dr.zero_grad(set_to_none=True)  # the loop zeroes replica 0 (its optimizer's)
        self.engine.on_backward = (lambda r, loss: loss_hook(loss)) if loss_hook else None
        results = self.engine.run_step(batches)
        replicas.average_grads(self.drafters)
        out = []
        for res in results:
            m = {k: (v.to(self.device) if hasattr(v, "to") else v) for k, v in res.metrics.items()}
            if loss_hook is not None:
                m["loss"] = res.loss.to(self.device)
            out.append(m)
        return out

    def after_step(self) -> None:
        """After the optimizer stepped replica 0: copy its parameters into every replica."""
        replicas.broadcast_params(self.drafters)

    def before_save(self) -> None:
        replicas.check_equal(self.drafters)

    def compiled_call(self):
        return self.rt.compile.run_probe

    def close(self) -> None:
        self.engine.stop()
        self.gate.unseal()

