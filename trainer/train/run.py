"""One training run's state and its step loop (``TrainingRun``), which ``train`` builds.

The run owns the optimizer, the LR schedule (``Schedule``), the data stream, the held-out
evaluation, checkpoints and the best pointer; the layout (trainer.parallel) owns the models
and how one step's gradients are computed; the runtime (trainer.core.runtime) the process's
compile registry and fault injection.
"""

from __future__ import annotations

import math
import os
import signal
import time

import torch

from dfo_contract import checkpoints as manifests
from dfo_contract.exitcodes import DONE, INTERRUPTED, NonFiniteLoss, TrainerError
from dfo_contract.trainer_config import TrainerConfig
from dfo_contract.trainer_markers import BestMarker, CheckpointMarker, DoneMarker

from ..compile.precompile import save_precompile_entries
from ..core import checkpoints, objective
from ..core.methods import method_of
from ..core.runtime import Runtime
from ..evaluate import accept
from ..telemetry import faults, metrics


class Schedule:
    """Linear warm-up over ``warmup_ratio`` of the horizon, then cosine/linear decay/constant."""

    def __init__(self, cfg: TrainerConfig):
        t = cfg.train
        self.base_lr, self.kind, self.min_ratio = t.lr, t.schedule, t.min_lr_ratio
        self.total = cfg.schedule_steps()
        self.warmup = int(math.ceil(t.warmup_ratio * self.total))
        self.step = 0

    def lr_at(self, step: int) -> float:
        """LR for optimizer step ``step + 1`` (``step`` steps done)."""
        if self.warmup and step < self.warmup:
            return self.base_lr * (step + 1) / self.warmup
        if self.kind == "constant":
            return self.base_lr
        span = max(1, self.total - self.warmup)
        frac = min(1.0, (step - self.warmup) / span)
        f = 0.5 * (1 + math.cos(math.pi * frac)) if self.kind == "cosine" else 1.0 - frac
        return self.base_lr * (self.min_ratio + (1 - self.min_ratio) * f)

    def state_dict(self) -> dict:
        return {"step": self.step, "base_lr": self.base_lr, "kind": self.kind,
                "total": self.total, "warmup": self.warmup, "min_ratio": self.min_ratio}

    def load_state_dict(self, st: dict) -> None:
        self.step = int(st["step"])


def _read_resume(ckdir: str, spec: str, device) -> dict | TrainerError:
    """The main rank's resume state: the checkpoint (trainer.core.checkpoints.read) and the best
    pointer; a TrainerError is returned (to be shared and raised on every rank)."""
    try:
        st = checkpoints.read(manifests.resolve(ckdir, spec), device=device)
        st["best"] = accept.read_best(ckdir)
        return st
    except TrainerError as e:
        return e


class TrainingRun:
    """Optimizer, schedule, data, checkpoints and evaluation of one run, stepped by ``run``."""

    def __init__(self, cfg: TrainerConfig, rt: Runtime, layout, em: metrics.Emitter, stream,
                 held: accept.HeldOut | None):
        self.cfg, self.rt, self.layout, self.em = cfg, rt, layout, em
        self.stream, self.held = stream, held
        self.drafter = layout.drafter
        self.method = method_of(cfg)   # the drafter method's record (trainer.core.methods)
        self.params = layout.parameters()
        t = cfg.train
        self.opt = torch.optim.AdamW(self.params, lr=t.lr, betas=(t.beta1, t.beta2),
                                     weight_decay=t.weight_decay, eps=1e-8)
        self.sched = Schedule(cfg)
        self.ckdir = cfg.checkpoint_dir(rt.env.run_dir)
        self.step = 0
        self.saved = -1                    # the step last checkpointed (-1: none)
        self.best = float("-inf")          # the best measured acceptance length so far

    # -- resume -------------------------------------------------------------------------
    def resume(self, spec: str) -> None:
        """Load checkpoint ``spec`` (and the best pointer) into this run, on every rank.

        Only the main rank opens the checkpoint dir (another node may not have it); ddp
        broadcasts what it read, errors included, so every rank resumes alike."""
        layout = self.layout
        got = layout.from_main(_read_resume(self.ckdir, spec, layout.device)
                               if layout.is_main else None)
        if isinstance(got, Exception):
            raise got
        st = checkpoints.apply(got, drafter=self.drafter, optimizer=self.opt, scheduler=self.sched)
        self.stream.load_state_dict(st)
        self.step = self.saved = int(st["step"])
        if got["best"]:
            self.best = float(got["best"]["accept_len"])
        self.em.print(f"resumed from {got['path']} at step {self.step}")

    # -- checkpoints and evaluation -------------------------------------------------------
    def save(self, at: int, extra: dict | None = None) -> str | None:
        """Checkpoint step ``at`` (main rank); the same state saved already is not rewritten."""
        em = self.em
        self.layout.before_save()  # threads/ddp: replicas identical (all ranks)
        if not self.layout.is_main:  # ddp: only the main rank touches the checkpoint dir
            self.saved = at
            return None
        existing = os.path.join(self.ckdir, f"step_{at}")
        if (at == self.saved and extra is None
                and manifests.verify(existing, check_hashes=False)[0]):
            em.emit(CheckpointMarker(step=at, path=os.path.abspath(existing)))
            return existing  # this exact state is already saved (e.g. SIGTERM right after)
        em.set_phase("checkpoint")
        cfg, env = self.cfg, self.rt.env
        p = checkpoints.save(self.ckdir, at, drafter=self.drafter, optimizer=self.opt,
                             scheduler=self.sched, data_state=self.stream.state_dict(),
                             config_yaml=cfg.to_yaml(), keep=cfg.checkpoint.keep,
                             run_id=env.run_id, attempt=env.attempt, extra=extra)
        self.saved = at
        em.emit(CheckpointMarker(step=at, path=os.path.abspath(p)))
        em.set_phase("train")
        return p

    def evaluate(self, at: int) -> None:
        """Measured acceptance length on the held-out data: an ``eval`` record in
        metrics.jsonl and the markers; a new best is checkpointed and pointed to."""
        if self.held is None:         # no held-out data: nothing to measure
            return
        em = self.em
        em.set_phase("eval")
        t0 = time.perf_counter()
        ev = self.held.run(self.drafter, self.layout.target, self.cfg)
        al = ev["accept_len"]
        improved = al is not None and al > self.best
        if improved:
            self.best = al
        em.eval({"step": at, "accept_len": al, "eval_blocks": ev["blocks"],
                 "eval_s": round(time.perf_counter() - t0, 3), "eval_target": ev["target"],
                 "best_accept_len": None if self.best == float("-inf") else self.best})
        em.set_phase("train")
        if improved:
            self.save(at, extra={"accept_len": al})
            if self.layout.is_main:
                accept.write_best(self.ckdir, at, al)
                em.emit(BestMarker(step=at, accept_len=al))

    # -- the step loop ----------------------------------------------------------------------
    def run(self, sig, hb: metrics.Heartbeat, *, precompile_pending: bool) -> int:
        """Step to ``train.max_steps`` (DONE), or stop at a signal with a checkpoint
        (INTERRUPTED)."""
        cfg, layout, em = self.cfg, self.layout, self.em
        fault_spec = faults.resolve_spec(cfg.fault.spec, self.rt.env)
        log = _LogWindow()
        n_micro = cfg.train.grad_accum * layout.data_parallel
        mine = layout.micro_indices(n_micro)
        while self.step < cfg.train.max_steps:
            if layout.agree_stop(sig.received is not None):  # ddp: all ranks stop together
                self.save(self.step)
                em.print(f"interrupted by {signal.Signals(sig.received or signal.SIGTERM).name} "
                         f"at step {self.step}; checkpoint saved")
                return INTERRUPTED
            effects = self.rt.faults.maybe_inject(
                self.step + 1, attempt=self.rt.env.attempt, spec=fault_spec,
                compiled_call=layout.compiled_call() if fault_spec else None)
            lr = self._one_step(n_micro, mine, effects, log)
            hb.progress(self.step)
            if em.phase != "train":
                em.set_phase("train")
            if precompile_pending:  # everything compiled lazily in step 1
                save_precompile_entries()
                precompile_pending = False
            self._after_step(lr, log)
        if cfg.checkpoint.save_final:
            self.save(self.step)
        em.emit(DoneMarker(step=self.step))
        return DONE

    def _one_step(self, n_micro: int, mine: list[int], effects, log: "_LogWindow") -> float:
        """One optimizer step over ``n_micro`` micro-batches; returns its learning rate."""
        cfg, layout = self.cfg, self.layout
        lr = self.sched.lr_at(self.step)
        for gparam in self.opt.param_groups:
            gparam["lr"] = lr
        self.method.before_step(getattr(layout, "drafters", None) or [self.drafter], cfg,
                                self.step, self.sched.total)
        batches = self.stream.take(n_micro, keep=mine)  # ddp: other ranks' are only counted
        self.opt.zero_grad(set_to_none=True)
        hook = effects.apply_to_loss if effects.nan else None
        log.pending.extend(layout.grads(batches, loss_hook=hook))
        if cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, cfg.train.grad_clip)
        self.opt.step()
        layout.after_step()  # threads: copy replica 0 into the others
        self.step += 1
        self.sched.step = self.step
        log.tokens += sum(b.num_tokens for b in batches)
        log.samples += sum(b.num_samples for b in batches)
        return lr

    def _after_step(self, lr: float, log: "_LogWindow") -> None:
        """The step record at log steps, the evaluation and the checkpoint when due."""
        cfg, step = self.cfg, self.step
        last = step == cfg.train.max_steps
        if step % cfg.train.log_every == 0 or last:
            self.em.step(log.record(step, lr, self.layout.device, self.rt.env.attempt))
        evaluated = False
        if self.held is not None and (step % cfg.eval.every == 0 or last):
            self.evaluate(step)
            evaluated = True
        if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and not (
                evaluated and self.saved == step):
            self.save(step)


class _LogWindow:
    """The metrics of the steps since the last step record, and its throughput."""

    def __init__(self):
        self.pending: list[dict] = []
        self.tokens = self.samples = 0
        self.t0 = time.perf_counter()

    def record(self, step: int, lr: float, device, attempt: int) -> dict:
        """The step record of the window (then a new window starts); a non-finite loss
        raises NonFiniteLoss."""
        host = metrics.to_host(objective.summarize(self.pending))
        dt = max(time.perf_counter() - self.t0, 1e-9)
        rec = {"step": step, "loss": host["loss"], "acc": host["acc"], "tau": host["tau"],
               "lr": lr, "tokens_per_s": round(self.tokens / dt, 2),
               "samples_per_s": round(self.samples / dt, 3),
               "peak_mem_bytes": metrics.peak_mem_bytes(device),
               "phase": "train", "attempt": attempt,
               "acc_per_pos": [round(a, 4) for a in host["acc_per_pos"]]}
        if not math.isfinite(host["loss"]):
            raise NonFiniteLoss(f"loss is {host['loss']} at step {step} (nan_loss); "
                                "lower --train.lr or resume from an earlier checkpoint")
        self.pending, self.tokens, self.samples = [], 0, 0
        self.t0 = time.perf_counter()
        return rec
