"""``python -m trainer warmup``: the compile gate's warm-up, without training.

    python -m trainer warmup --config FILE.yaml [--SECTION.FIELD VALUE ...]
        [--report FILE.json] [--save-mega-cache FILE] [--load-mega-cache FILE]

For every device of the configured layout and every shape bucket (``step.shape_buckets``),
sequentially in one thread: build the models on the device, run the drafter step forward +
backward on a dummy batch of that shape, and record the time and the compile-cache counters
(``torch._dynamo.utils.counters``: inductor ``fxgraph_cache_hit/miss``, aot_autograd
``autograd_cache_hit/miss``). Heartbeats (``@dfo {"kind": "heartbeat", ...}``) are printed at
least every ``train.heartbeat_s`` seconds meanwhile.

What gets compiled is what the training step compiles (the process's compile registry,
trainer.core.runtime.Runtime): the drafter step
(layers + loss) when ``compile.enabled``, flex_attention when the attention backend is
``flex``, and the target's decoder layers when ``compile.target`` (on the drafter devices
here: the on-disk cache serves target devices of the same kind). On CPU (torch 2.13) compiled flex has no backward, so the trainer's ``auto`` backend
is ``sdpa`` there; with ``compile.enabled`` the inductor still compiles the drafter step's
forward and backward, which are the cache entries the compile-cache tests hit.

``--save-mega-cache FILE`` writes ``torch.compiler.save_cache_artifacts()`` (all the cache
artifacts this process produced or loaded) atomically; ``--load-mega-cache FILE`` feeds a
saved file to ``torch.compiler.load_cache_artifacts()`` before anything compiles. Both need
torch >= 2.7; on an older torch the flag is refused with a config error.

Exit codes: the trainer's table (dfo_contract.exitcodes): 0 done, 2 config error, 5 fatal.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from dfo_contract.exitcodes import CONFIG_ERROR, DONE, TrainerConfigError, exit_code_for
from dfo_contract.fsio import atomic_write_bytes
from dfo_contract.trainer_markers import DoneMarker

USAGE = ("usage: python -m trainer warmup --config FILE.yaml [--SECTION.FIELD VALUE ...] "
         "[--report FILE.json] [--save-mega-cache FILE] [--load-mega-cache FILE]")
_OWN_FLAGS = ("--config", "--report", "--save-mega-cache", "--load-mega-cache")


def parse_args(argv: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """Split our own flags from the config overrides (pure; the same rules as ``train``)."""
    from dfo_contract.trainer_config import split_args

    config, opts, rest = split_args(argv, tuple(k for k in _OWN_FLAGS if k != "--config"))
    if any(a in ("-h", "--help") for a in rest):
        raise SystemExit(print(USAGE) or 0)
    own: dict[str, str | None] = {k: None for k in _OWN_FLAGS}
    own.update(opts)
    own["--config"] = config
    return own, rest


def _resolve(dev: str) -> str:
    import torch

    if dev == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if dev == "cuda":
        return "cuda:0"
    return dev


def warm_devices(cfg) -> list[str]:
    """The distinct devices that warm: the drafter devices (a compiled target is warmed there).

    For ``ddp`` the list names the ranks' devices. Kernels in the on-disk cache are shared by
    devices of the same kind, so warming one of several identical GPUs fills the cache for
    all; the in-process warm-up of a training run still covers every device and replica.
    """
    devs = [_resolve(d) for d in cfg.parallel.drafter_devices]
    out: list[str] = []
    for d in devs:
        if d not in out:
            out.append(d)
    return out


def make_task(cfg, rt, device: str, shape: tuple[int, int], target, drafter, *, what=None):
    """A WarmupTask running the real drafter step (target forward, drafter fwd+bwd) once,
    compiled through ``rt`` (the process's trainer.core.runtime.Runtime)."""
    from ..core import step
    from ..compile.gate import WarmupTask

    seq_len, anchors = shape

    def run() -> None:
        batch = step.dummy_batch(cfg, seq_len, anchors, cfg.train.micro_batch, device)
        feats = step.target_features(target, batch, cfg)
        if drafter is not None:
            loss, _ = step.drafter_loss(drafter, feats, batch, cfg, rt)
            loss.backward()
            drafter.zero_grad(set_to_none=True)

    return WarmupTask(device=device, shape=(seq_len, anchors), run=run,
                      what=what or step.warmup_what(cfg, "drafter step"))


def _write_file(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_bytes(path, data)


def load_mega_cache(path: str) -> dict:
    import torch

    loader = getattr(torch.compiler, "load_cache_artifacts", None)
    if loader is None:
        raise TrainerConfigError(f"config: --load-mega-cache: torch {torch.__version__} has no "
                                 "torch.compiler.load_cache_artifacts (needs torch >= 2.7)")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise TrainerConfigError(f"config: --load-mega-cache: file {path} does not exist") from None
    info = loader(data)
    return {"loaded": path, "bytes": len(data), "info": _cache_info(info)}


def save_mega_cache(path: str) -> dict:
    import torch

    saver = getattr(torch.compiler, "save_cache_artifacts", None)
    if saver is None:
        raise TrainerConfigError(f"config: --save-mega-cache: torch {torch.__version__} has no "
                                 "torch.compiler.save_cache_artifacts (needs torch >= 2.7)")
    got = saver()
    if got is None:
        return {"saved": None, "bytes": 0, "why": "no cache artifacts were produced"}
    data, info = got
    _write_file(path, data)
    return {"saved": path, "bytes": len(data), "info": _cache_info(info)}


def _cache_info(info) -> dict:
    if info is None:
        return {}
    arts = getattr(info, "artifacts", None)
    if isinstance(arts, dict):
        return {str(k): len(v) for k, v in arts.items()}
    return {"repr": repr(info)[:200]}


def run_warmup(cfg, rt=None, *, load_cache: str | None = None, save_cache: str | None = None,
               preload_imports: bool = True) -> dict:
    """Warm every device x bucket of ``cfg``; return the report (also printed as lines).
    ``rt``: the process's trainer.core.runtime.Runtime (None: made now)."""
    import torch

    from ..core.runtime import Runtime

    from ..core import step
    from ..telemetry import metrics
    from ..compile.gate import (BypassReasons, CompileGate, counters_delta, counters_snapshot,
                                default_dynamo_settings, describe)

    from ..compile.precompile import save_precompile_entries, verify_precompile_entries

    rt = rt if rt is not None else Runtime.create()
    report: dict[str, Any] = {"torch": torch.__version__, "layout": cfg.parallel.layout,
                              "attention": cfg.model.attention,
                              "compile_enabled": cfg.compile.enabled,
                              "precompile": cfg.compile.precompile,
                              "compile_target": cfg.compile.target}
    rt.compile.configure_kernels(cfg)
    if load_cache:
        report["mega_cache_load"] = load_mega_cache(load_cache)
    if cfg.compile.precompile:
        rt.compile.cache.configure(precompile=True)
        chk = verify_precompile_entries()
        report["precompile_check"] = {"dir": chk.dir, "kept": chk.kept, "dropped": chk.dropped}
    preload = _Preload.start() if preload_imports else None
    devs = warm_devices(cfg)
    buckets = step.shape_buckets(cfg)
    report["devices"], report["buckets"] = devs, [list(b) for b in buckets]
    n_variants = step.compile_variants(cfg, len(devs), len(devs))
    gate = rt.compile.install_gate(CompileGate(True, default_dynamo_settings(n_variants),
                                               cache=rt.compile.cache))
    total0 = counters_snapshot()
    t0 = time.perf_counter()

    def on_record(rec) -> None:
        print(describe(rec), flush=True)

    em = metrics.Emitter(None)
    em.set_phase("warmup")
    bypass = BypassReasons()
    build_s: dict[str, float] = {}
    with metrics.Heartbeat(em, every_s=cfg.train.heartbeat_s) as hb, bypass:
        tasks = []
        for dev in devs:
            tb = time.perf_counter()
            target, drafter = step.build_models(cfg, torch.device(dev), rt=rt)
            _sync_dev(dev)
            build_s[dev] = round(time.perf_counter() - tb, 3)
            tasks += [make_task(cfg, rt, dev, b, target, drafter) for b in buckets]
            hb.progress()
        if preload is not None:
            report["preload_wait_s"] = preload.join()
        def recorded(rec) -> None:
            on_record(rec)
            hb.progress()

        gate.warmup(tasks, on_record=recorded)
    report["records"] = gate.report()
    report["totals"] = counters_delta(total0, counters_snapshot())
    report["seconds"] = round(time.perf_counter() - t0, 3)
    report["build_models_s"] = build_s
    report["phases"] = _sum_phases(report["records"])
    report["autograd_bypass_reasons"] = bypass.reasons
    if save_cache:
        report["mega_cache_save"] = save_mega_cache(save_cache)
    if cfg.compile.precompile:  # after the mega save: it rewrites the same entries
        report["precompile_save"] = save_precompile_entries()
    return report


def _sync_dev(dev: str) -> None:
    if dev.startswith("cuda"):
        import torch

        torch.cuda.synchronize(dev)


def _sum_phases(records: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in records:
        for k, v in (r.get("phases") or {}).items():
            out[k] = round(out.get(k, 0.0) + v, 3)
    return out


#: the compile stack, imported in a thread while the models build (run_warmup's preload_imports)
_PRELOAD_MODULES = ("torch._dynamo", "torch._inductor.compile_fx", "torch._functorch.aot_autograd",
                    "torch._inductor.codecache", "torch._inductor.runtime.triton_heuristics")


class _Preload:
    """Imports of dynamo/AOT/inductor (and triton, which inductor's runtime imports) that the
    first compile would otherwise pay for, done in a background thread during build_models.
    Python's import lock makes a concurrent import by the main thread wait, never run twice."""

    def __init__(self):
        import threading

        self.took = 0.0
        self.thread = threading.Thread(target=self._run, name="dfo-preload", daemon=True)

    @classmethod
    def start(cls) -> "_Preload":
        p = cls()
        p.thread.start()
        return p

    def _run(self) -> None:
        import importlib

        t0 = time.perf_counter()
        for m in _PRELOAD_MODULES:
            try:
                importlib.import_module(m)
            except Exception:  # noqa: BLE001 - a torch without the module: the compile imports it
                pass
        self.took = time.perf_counter() - t0

    def join(self) -> float:
        """Wait for the imports; the seconds waited (0 when they were done)."""
        t0 = time.perf_counter()
        self.thread.join()
        return round(time.perf_counter() - t0, 3)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        own, rest = parse_args(argv)
        from dfo_contract.trainer_config import load_config

        cfg = load_config(own["--config"], rest)
        from ..core.init_from import resolve

        resolve(cfg)  # model.init_from: the released drafter's taps, block size, mask token
        from ..core.runtime import Runtime

        report = run_warmup(cfg, Runtime.create(), load_cache=own["--load-mega-cache"],
                            save_cache=own["--save-mega-cache"])
        if own["--report"]:
            _write_file(own["--report"], (json.dumps(report, indent=2) + "\n").encode())
        from ..compile.gate import describe_phases

        t = report["totals"]
        print(f"warmup: done in {report['seconds']:.1f} s, {len(report['records'])} "
              f"device x shape units; fxgraph hit {t.get('fxgraph_cache_hit', 0)} miss "
              f"{t.get('fxgraph_cache_miss', 0)}, autograd hit {t.get('autograd_cache_hit', 0)} "
              f"miss {t.get('autograd_cache_miss', 0)} bypass {t.get('autograd_cache_bypass', 0)}"
              f", dynamo cache hit {t.get('dynamo_cache_hit', 0)} miss {t.get('dynamo_cache_miss', 0)}"
              f"\nwarmup: build_models {sum(report['build_models_s'].values()):.2f} s; "
              f"compile phases (all shapes): {describe_phases(report['phases'])}"
              + "".join(f"\nwarmup: autograd cache bypassed: {w}"
                        for w in report["autograd_bypass_reasons"]), flush=True)
        from ..telemetry.metrics import Emitter

        Emitter(None).emit(DoneMarker(step=0))
        return DONE
    except TrainerConfigError as e:
        print(f"trainer: error: {e}", file=sys.stderr, flush=True)
        return CONFIG_ERROR
    except Exception as e:  # noqa: BLE001 - the trainer's exit-code table
        code = exit_code_for(e)
        if code == 5:
            import traceback

            traceback.print_exc()
        print(f"trainer: error: {e}", file=sys.stderr, flush=True)
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
