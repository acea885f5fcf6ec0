"""The training loop: ``train(cfg, resume=None) -> exit code``.

One optimizer step = ``grad_accum * layout.data_parallel`` micro-batches. The loop owns
the data stream, optimizer, LR schedule, metrics, checkpoints, signals and the fault
hook; a *layout* (``trainer.parallel.Layout``, made by ``trainer.parallel.make_layout``)
owns the models and how one step's gradients are computed.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time

import torch

from dfo_contract import checkpoints as manifests
from dfo_contract.exitcodes import DONE, INTERRUPTED, NonFiniteLoss, TrainerError
from dfo_contract.trainer_config import TrainerConfig
from dfo_contract.trainer_markers import BestMarker, CheckpointMarker, DoneMarker, StartupMarker

from ..evaluate import accept
from ..env import process_start_t, read_env
from ..core import checkpoints, init_from, objective
from ..core.objective2 import selector_alpha_at
from ..telemetry import faults, metrics
from ..compile import registry
from ..compile import settings as compile_settings
from ..compile.precompile import save_precompile_entries, verify_precompile_entries
from ..data.datasets import JsonlDataset, open_dataset
from ..data.stream import BatchStream
from ..data.tokenizer import load_tokenizer
from ..parallel import make_layout

log = logging.getLogger("dfo")


# --------------------------------------------------------------------------- LR schedule

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


# --------------------------------------------------------------------------- helpers

class _Signals:
    """SIGTERM/SIGINT -> a flag checked between steps; a second signal exits at once."""

    def __init__(self):
        self.received: int | None = None
        self._old = {}

    def _handler(self, signum, _frame):
        if self.received is not None:
            os._exit(INTERRUPTED)
        self.received = signum
        log.warning("received %s: will save a checkpoint and exit", signal.Signals(signum).name)

    def install(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread (tests calling train() in a thread)
                pass
        return self

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)


def open_data(cfg: TrainerConfig, vocab_size: int, mask_id: int | None) -> JsonlDataset:
    tok = load_tokenizer(cfg.model.target_path) if cfg.data.format in ("auto", "chat") else None
    return open_dataset(cfg.data.path, vocab_size=vocab_size, block_size=cfg.model.block_size,
                        max_seq_len=cfg.data.max_seq_len, min_loss_tokens=cfg.min_loss_tokens(),
                        fmt=cfg.data.format, tokenizer=tok, mask_token_id=mask_id)


def _read_resume(ckdir: str, spec: str, device) -> dict | TrainerError:
    """The main rank's resume state: the checkpoint (trainer.core.checkpoints.read) and the best
    pointer; a TrainerError is returned (to be shared and raised on every rank)."""
    try:
        st = checkpoints.read(manifests.resolve(ckdir, spec), device=device)
        st["best"] = accept.read_best(ckdir)
        return st
    except TrainerError as e:
        return e


# --------------------------------------------------------------------------- train

def train(cfg: TrainerConfig, resume: str | None = None, *, out=None) -> int:
    """Run training to ``train.max_steps``. Returns an exit code (0 done, 6 interrupted);
    raises TrainerError subclasses (config/data/checkpoint) and anything fatal."""
    init_from.resolve(cfg)  # a released drafter's taps, block size, mask token (in place)
    env = read_env()  # this attempt's environment, read once and passed down
    started = metrics.Startup(env.spawn_t or process_start_t())
    attempt = env.attempt
    sig = _Signals().install()
    # multi-node: only the head's writer may create the run dir (others learn it at make_layout)
    em = metrics.Emitter(cfg.run_dir(env.run_dir), attempt=attempt, out=out,
                         enabled=env.node_rank is None or env.claims_main)
    hb = metrics.Heartbeat(em, every_s=cfg.train.heartbeat_s)
    layout = None
    try:
        em.set_phase("compile")
        hb.start()
        torch.manual_seed(cfg.train.seed)
        registry.configure_kernels(cfg)
        precompile = cfg.compile.enabled and cfg.compile.precompile
        if precompile:  # dynamo's precompile cache, as `trainer warmup` uses it
            compile_settings.configure(precompile=True)
            verify_precompile_entries()
        layout = make_layout(cfg, env)
        started.mark("layout")
        em.enabled = layout.is_main
        drafter = layout.drafter
        if layout.target.compiled_layers:  # compile.target
            em.print(f"compile: target: {layout.target.layers_run} decoder layers compiled as "
                     f"{layout.target.compiled_layers} (one graph per device"
                     + ("" if cfg.compile.target_dynamic else " and sequence bucket")
                     + ", warmed with the drafter step)")
        ds = open_data(cfg, layout.target.vocab_size, drafter.mask_token_id)
        r = ds.report
        em.print(r.describe(cfg.min_loss_tokens()))
        if r.mask_token_hits:
            log.warning("data: %d samples contain the mask token id %d; pick an unused id "
                        "(--model.mask_token_id)", r.mask_token_hits, drafter.mask_token_id)
        stream = BatchStream(ds, micro_batch=cfg.train.micro_batch, block_size=cfg.model.block_size,
                             num_anchors=cfg.data.num_anchors, seq_buckets=cfg.seq_buckets(),
                             anchor_buckets=cfg.anchor_buckets(), seed=cfg.train.seed,
                             shuffle=cfg.data.shuffle)
        started.mark("data")
        held = None
        if cfg.eval.every:
            if not cfg.data.eval_path:
                from dfo_contract.exitcodes import TrainerConfigError
                raise TrainerConfigError("config: --eval.every: needs --data.eval_path (held-out "
                                         "data in the training data's format)")
            held = accept.HeldOut(cfg, vocab_size=layout.target.vocab_size,
                                  mask_token_id=drafter.mask_token_id)
            em.print(f"eval: {cfg.data.eval_path}: {len(held.batches)} batches every "
                     f"{cfg.eval.every} steps (measured acceptance length)")
        params = layout.parameters()
        opt = torch.optim.AdamW(params, lr=cfg.train.lr, betas=(cfg.train.beta1, cfg.train.beta2),
                                weight_decay=cfg.train.weight_decay, eps=1e-8)
        sched = Schedule(cfg)
        ckdir = cfg.checkpoint_dir(env.run_dir)
        step = 0
        prev_best = None
        if resume:
            # only the main rank opens the checkpoint dir (another node may not have it);
            # ddp broadcasts what it read, errors included, so every rank resumes alike
            got = layout.from_main(_read_resume(ckdir, resume, layout.device)
                                   if layout.is_main else None)
            if isinstance(got, Exception):
                raise got
            st = checkpoints.apply(got, drafter=drafter, optimizer=opt, scheduler=sched)
            stream.load_state_dict(st)
            step = int(st["step"])
            prev_best = got["best"]
            em.print(f"resumed from {got['path']} at step {step}")
            started.mark("resume")
        warmed = layout.warmup(em, cfg.train.heartbeat_s)
        if warmed:
            started.mark("warm-up")
        em.print(started.line())
        em.emit(StartupMarker.from_record({"step": step, **started.fields()}))
        precompile_pending = precompile  # saved once everything compiled: after warm-up or step 1
        if precompile and warmed:
            save_precompile_entries()
            precompile_pending = False
        want = "train" if (step or warmed) else "compile"  # no warm-up: step 1 compiles lazily
        if em.phase != want:
            em.set_phase(want)

        def save(at: int, extra: dict | None = None) -> str | None:
            layout.before_save()  # threads/ddp: replicas identical (all ranks)
            if not layout.is_main:  # ddp: only the main rank touches the checkpoint dir
                step_saved[0] = at
                return None
            existing = os.path.join(ckdir, f"step_{at}")
            if (at == step_saved[0] and extra is None
                    and manifests.verify(existing, check_hashes=False)[0]):
                em.emit(CheckpointMarker(step=at, path=os.path.abspath(existing)))
                return existing  # this exact state is already saved (e.g. SIGTERM right after)
            em.set_phase("checkpoint")
            p = checkpoints.save(ckdir, at, drafter=drafter, optimizer=opt, scheduler=sched,
                                 data_state=stream.state_dict(), config_yaml=cfg.to_yaml(),
                                 keep=cfg.checkpoint.keep, run_id=env.run_id, attempt=attempt,
                                 extra=extra)
            step_saved[0] = at
            em.emit(CheckpointMarker(step=at, path=os.path.abspath(p)))
            em.set_phase("train")
            return p

        step_saved = [step if resume else -1]
        best = float(prev_best["accept_len"]) if prev_best else float("-inf")

        def run_eval(at: int, best: float) -> float:
            """Measured acceptance length on the held-out data: an ``eval`` record in
            metrics.jsonl and the markers; a new best is checkpointed and pointed to."""
            em.set_phase("eval")
            t0 = time.perf_counter()
            ev = held.run(drafter, layout.target, cfg)
            rec = {"step": at, "accept_len": ev["accept_len"], "eval_blocks": ev["blocks"],
                   "eval_s": round(time.perf_counter() - t0, 3), "best_accept_len": None}
            al = ev["accept_len"]
            improved = al is not None and al > best
            if improved:
                best = al
            rec["best_accept_len"] = None if best == float("-inf") else best
            em.eval(rec)
            em.set_phase("train")
            if improved:
                save(at, extra={"accept_len": al})
                if layout.is_main:
                    accept.write_best(ckdir, at, al)
                    em.emit(BestMarker(step=at, accept_len=al))
            return best

        fault_spec = faults.resolve_spec(cfg.fault.spec, env)
        pending: list[dict] = []
        tokens = samples = 0
        t_log = time.perf_counter()
        n_micro = cfg.train.grad_accum * layout.data_parallel
        mine = layout.micro_indices(n_micro)
        while step < cfg.train.max_steps:
            stop = layout.agree_stop(sig.received is not None)  # ddp: all ranks stop together
            if stop:
                save(step)
                em.print(f"interrupted by {signal.Signals(sig.received or signal.SIGTERM).name} "
                         f"at step {step}; "
                         "checkpoint saved")
                return INTERRUPTED
            effects = faults.maybe_inject(step + 1, attempt=attempt, spec=fault_spec,
                                          compiled_call=layout.compiled_call() if fault_spec else None)
            lr = sched.lr_at(step)
            for gparam in opt.param_groups:
                gparam["lr"] = lr
            if cfg.model.method == "dflash2":
                alpha = selector_alpha_at(cfg.train, step, sched.total)
                for dr in getattr(layout, "drafters", None) or [drafter]:
                    dr.set_selector_alpha(alpha)
            batches = stream.take(n_micro, keep=mine)  # ddp: other ranks' are only counted
            opt.zero_grad(set_to_none=True)
            hook = effects.apply_to_loss if effects.nan else None
            pending.extend(layout.grads(batches, loss_hook=hook))
            if cfg.train.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip)
            opt.step()
            layout.after_step()  # threads: copy replica 0 into the others
            step += 1
            sched.step = step
            hb.progress(step)
            tokens += sum(b.num_tokens for b in batches)
            samples += sum(b.num_samples for b in batches)
            if em.phase != "train":
                em.set_phase("train")
            if precompile_pending:
                save_precompile_entries()
                precompile_pending = False
            if step % cfg.train.log_every == 0 or step == cfg.train.max_steps:
                host = metrics.to_host(objective.summarize(pending))
                dt = max(time.perf_counter() - t_log, 1e-9)
                rec = {"step": step, "loss": host["loss"], "acc": host["acc"], "tau": host["tau"],
                       "lr": lr, "tokens_per_s": round(tokens / dt, 2),
                       "samples_per_s": round(samples / dt, 3),
                       "peak_mem_bytes": metrics.peak_mem_bytes(layout.device),
                       "phase": "train", "attempt": attempt,
                       "acc_per_pos": [round(a, 4) for a in host["acc_per_pos"]]}
                if not math.isfinite(host["loss"]):
                    raise NonFiniteLoss(f"loss is {host['loss']} at step {step} (nan_loss); "
                                        "lower --train.lr or resume from an earlier checkpoint")
                em.step(rec)
                pending, tokens, samples, t_log = [], 0, 0, time.perf_counter()
            evaluated = False
            if held is not None and (step % cfg.eval.every == 0 or step == cfg.train.max_steps):
                best = run_eval(step, best)
                evaluated = True
            if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and not (
                    evaluated and step_saved[0] == step):
                save(step)
        if cfg.checkpoint.save_final:
            save(step)
        em.emit(DoneMarker(step=step))
        return DONE
    finally:
        hb.stop()
        sig.restore()
        if layout is not None:
            layout.close()
