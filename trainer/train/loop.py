"""The training entry point: ``train(cfg, resume=None) -> exit code``.

``train`` builds the process's parts in order -- the runtime (trainer.core.runtime: the
environment, compile registry, fault injection), the metrics emitter and heartbeat, the
layout (``trainer.parallel.make_layout``: the models and how one step's gradients are
computed), the data stream and held-out data -- then a ``TrainingRun`` (trainer.train.run:
optimizer, schedule, checkpoints, evaluation, the step loop), resumes it, warms the compiled
code up and runs it. One optimizer step = ``grad_accum * layout.data_parallel`` micro-batches.
"""

from __future__ import annotations

import logging
import os
import signal

import torch

from dfo_contract.exitcodes import INTERRUPTED, TrainerConfigError
from dfo_contract.trainer_config import TrainerConfig
from dfo_contract.trainer_markers import StartupMarker

from ..compile.precompile import save_precompile_entries, verify_precompile_entries
from ..core import init_from
from ..core.runtime import Runtime
from ..data.datasets import JsonlDataset, open_dataset
from ..data.stream import BatchStream, PackedStream, stream_for
from ..env import process_start_t
from ..evaluate import accept
from ..parallel import make_layout
from ..telemetry import metrics
from .run import TrainingRun

log = logging.getLogger("dfo")


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


def open_data(cfg: TrainerConfig, rt: Runtime, vocab_size: int, mask_id: int | None) -> JsonlDataset:
    tok = rt.tokenizers.load(cfg.model.target_path) if cfg.data.format in ("auto", "chat") else None
    return open_dataset(cfg.data.path, vocab_size=vocab_size, block_size=cfg.model.block_size,
                        max_seq_len=cfg.data.max_seq_len, min_loss_tokens=cfg.min_loss_tokens(),
                        fmt=cfg.data.format, tokenizer=tok, mask_token_id=mask_id)


def open_stream(cfg: TrainerConfig, rt: Runtime, layout,
                em: metrics.Emitter) -> BatchStream | PackedStream:
    """The training data as bucketed batches or packed rows; its scan report printed."""
    drafter = layout.drafter
    ds = open_data(cfg, rt, layout.target.vocab_size, drafter.mask_token_id)
    r = ds.report
    em.print(r.describe(cfg.min_loss_tokens()))
    if r.mask_token_hits:
        log.warning("data: %d samples contain the mask token id %d; pick an unused id "
                    "(--model.mask_token_id)", r.mask_token_hits, drafter.mask_token_id)
    return stream_for(ds, cfg)


def open_held_out(cfg: TrainerConfig, rt: Runtime, layout,
                  em: metrics.Emitter) -> accept.HeldOut | None:
    """The held-out data ``eval.every`` measures acceptance length on (None: no evaluation)."""
    if not cfg.eval.every:
        return None
    if not cfg.data.eval_path:
        raise TrainerConfigError("config: --eval.every: needs --data.eval_path (held-out "
                                 "data in the training data's format)")
    held = accept.HeldOut(cfg, vocab_size=layout.target.vocab_size,
                          mask_token_id=layout.drafter.mask_token_id, tokenizers=rt.tokenizers)
    em.print(f"eval: {cfg.data.eval_path}: {len(held.batches)} batches every "
             f"{cfg.eval.every} steps (measured acceptance length)")
    return held


def prepare_compile(cfg: TrainerConfig, rt: Runtime) -> bool:
    """The compile section's process settings, before anything compiles; whether dynamo's
    precompile cache is on (its entries are checked now, saved once everything compiled)."""
    rt.compile.configure_kernels(cfg)
    precompile = cfg.compile.enabled and cfg.compile.precompile
    if precompile:  # dynamo's precompile cache, as `trainer warmup` uses it
        rt.compile.cache.configure(precompile=True)
        verify_precompile_entries()
    return precompile


def describe_target_compile(cfg: TrainerConfig, layout, em: metrics.Emitter) -> None:
    if layout.target.compiled_layers:  # compile.target
        em.print(f"compile: target: {layout.target.layers_run} decoder layers compiled as "
                 f"{layout.target.compiled_layers} (one graph per device"
                 + ("" if cfg.compile.target_dynamic else " and sequence bucket")
                 + ", warmed with the drafter step)")


# --------------------------------------------------------------------------- train

def train(cfg: TrainerConfig, resume: str | None = None, *, out=None,
          rt: Runtime | None = None) -> int:
    """Run training to ``train.max_steps``. Returns an exit code (0 done, 6 interrupted);
    raises TrainerError subclasses (config/data/checkpoint) and anything fatal. ``rt``: the
    process's runtime (None: made now from the environment)."""
    init_from.resolve(cfg)  # a released drafter's taps, block size, mask token (in place)
    # this process's environment, compile registry and fault injection, passed down
    rt = rt if rt is not None else Runtime.create()
    env = rt.env
    started = metrics.Startup(env.spawn_t or process_start_t())
    sig = _Signals().install()
    # multi-node: only the head's writer may create the run dir (others learn it at make_layout)
    em = metrics.Emitter(cfg.run_dir(env.run_dir), attempt=env.attempt, out=out,
                         enabled=env.node_rank is None or env.claims_main,
                         silenced=rt.faults.silenced)
    hb = metrics.Heartbeat(em, every_s=cfg.train.heartbeat_s)
    layout = None
    try:
        em.set_phase("compile")
        hb.start()
        torch.manual_seed(cfg.train.seed)
        precompile = prepare_compile(cfg, rt)
        layout = make_layout(cfg, rt)
        started.mark("layout")
        em.enabled = layout.is_main
        describe_target_compile(cfg, layout, em)
        stream = open_stream(cfg, rt, layout, em)
        started.mark("data")
        run = TrainingRun(cfg, rt, layout, em, stream, open_held_out(cfg, rt, layout, em))
        if resume:
            run.resume(resume)
            started.mark("resume")
        warmed = layout.warmup(em, cfg.train.heartbeat_s)
        if warmed:
            started.mark("warm-up")
        em.print(started.line())
        em.emit(StartupMarker.from_record({"step": run.step, **started.fields()}))
        if precompile and warmed:  # everything compiled: saved now (else after step 1)
            save_precompile_entries()
        want = "train" if (run.step or warmed) else "compile"  # no warm-up: step 1 compiles
        if em.phase != want:
            em.set_phase(want)
        return run.run(sig, hb, precompile_pending=precompile and not warmed)
    finally:
        hb.stop()
        sig.restore()
        if layout is not None:
            layout.close()
