"""The ``single`` layout: target and drafter on one device, micro-batches run sequentially."""

from __future__ import annotations

import contextlib
import time

import torch

from ..compile import gate
from ..core import step as S
from ..core.runtime import Runtime
from ..telemetry import metrics
from .base import LayoutBase


class SingleLayout(LayoutBase):
    """Target and drafter on one device; micro-batches run sequentially with accumulation."""

    name = "single"

    def __init__(self, cfg, rt: Runtime | None = None):
        """``rt``: the process's runtime (None: one of its own)."""
        self.cfg = cfg
        self.rt = rt if rt is not None else Runtime.create()
        self.device = S.resolve_device(cfg.parallel.drafter_devices[0])
        tdev = S.resolve_device(cfg.parallel.target_devices[0])
        self.target, self.drafter = S.build_models(cfg, self.device, target_device=tdev,
                                                       rt=self.rt)
        self.uses_compiled = S.uses_compiled(cfg, [self.drafter])
        self._gate: gate.CompileGate | None = None
        # parallel.overlap_target: the target's forwards run on this stream (one CUDA device)
        self._side = (torch.cuda.Stream(self.device) if cfg.parallel.overlap_target
                      and self.device.type == "cuda" and self.target.device == self.device else None)

    def parameters(self):
        return self.drafter.trainable_parameters()

    def _features(self, b):
        """The target's features of ``b`` on the drafter's device; with a side stream, issued
        there (the caller waits for them with ``_ready``)."""
        if self._side is None:
            return S.target_features(self.target, b, self.cfg).to(self.device, non_blocking=True)
        with torch.cuda.stream(self._side):
            return S.target_features(self.target, b, self.cfg).to(self.device, non_blocking=True)

    def _ready(self, feats):
        """``feats`` usable on the current stream (waits for the side stream's forward)."""
        if self._side is not None:
            torch.cuda.current_stream(feats.device).wait_stream(self._side)
            feats.record_stream(torch.cuda.current_stream(feats.device))
        return feats

    def grads(self, batches, loss_hook=None) -> list[dict]:
        """Micro-batches in order; with ``parallel.overlap_target`` the target's forward of
        micro-batch i+1 is issued on the side stream before the drafter step of i, so the
        GPU runs the two side by side. The results are the sequential ones."""
        out = []
        n = len(batches)
        nxt = self._features(batches[0]) if batches else None
        for i, b in enumerate(batches):
            feats = self._ready(nxt)
            if i + 1 < n:
                nxt = self._features(batches[i + 1])
            loss, m = S.drafter_loss(self.drafter, feats, b, self.cfg, self.rt)
            if loss_hook is not None:
                loss = loss_hook(loss)
                m["loss"] = loss.detach()
            (loss / n).backward()
            out.append(m)
        return out

    def warmup(self, emitter: metrics.Emitter, heartbeat_s: float) -> list[dict]:
        """Compile every (seq_len, anchors) bucket once (fwd+bwd), sequentially, before step 1.

        Only when compiled code is in use. With ``compile.gate`` the gate runs the warm-up
        and is sealed afterwards (no compile after warm-up).
        """
        if not self.uses_compiled:
            return []
        buckets = S.shape_buckets(self.cfg)
        mb = self.cfg.train.micro_batch

        def run_bucket(shape):
            def run():
                b = S.dummy_batch(self.cfg, shape[0], shape[1], mb, self.device)
                feats = S.target_features(self.target, b, self.cfg)
                loss, _ = S.drafter_loss(self.drafter, feats, b, self.cfg, self.rt)
                loss.backward()
                self.drafter.zero_grad(set_to_none=True)
            return run

        emitter.set_phase("warmup")
        if self.cfg.compile.gate:
            limits = gate.default_dynamo_settings(S.compile_variants(self.cfg, 1, 1))
            g = self.rt.compile.install_gate(gate.CompileGate(enabled=True, settings=limits,
                                                              cache=self.rt.compile.cache))
            self._gate = g
            what = S.warmup_what(self.cfg, "drafter step")
            tasks = [gate.WarmupTask(device=str(self.device), shape=tuple(s), run=run_bucket(s),
                                     what=what) for s in buckets]
            # the loop's heartbeat thread is already running: no second one here
            recs = g.warmup(tasks, heartbeat=contextlib.nullcontext(),
                            on_record=lambda rec: emitter.print(gate.describe(rec)))
            g.seal()
            return [r.to_json() for r in recs]
        recs = []
        for s in buckets:
            t0 = time.perf_counter()
            run_bucket(s)()
            recs.append({"shape": list(s), "seconds": round(time.perf_counter() - t0, 3)})
        return recs

    def compiled_call(self):
        return self.rt.compile.probe_call(str(self.device))

    def close(self) -> None:
        if self._gate is not None:  # back to the default compile stance (in-process callers)
            self._gate.unseal()
