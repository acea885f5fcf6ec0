"""The compile gate: makes the threaded lazy-compile race impossible by construction.

The race (docs/recovery.md; docs/trainer.md, "Why the gate exists"): drafter threads that
lazily compiled flex_attention while other threads ran compiled code either raised torch's
``Detected that you are using FX to symbolically trace a dynamo-optimized function`` (torch
<= 2.13 keeps ``torch.fx._symbolic_trace._is_fx_tracing_flag`` process-global, and another
thread's make_fx sets it) or deadlocked on a cold cache. With the gate on:

1. **Warm-up** (``CompileGate.warmup``): before any worker steps, every compiled callable is
   compiled and run forward + backward once per device and per shape bucket, sequentially,
   in one thread, with heartbeats.
2. **Seal** (``CompileGate.seal``): ``torch.compiler.set_stance("fail_on_recompile")`` (a
   process-global stance, torch >= 2.6), so any compile after warm-up -- a new shape, a new
   device -- raises ``RecompileAfterWarmup`` naming the shape instead of racing.
3. **Lock** (``CompileGate.guard``): a process-wide re-entrant lock around every call into
   compiled code (the process's ``CompileRegistry.install_gate`` makes it the registry's call
   guard; each backward through compiled graphs takes it too).
4. **Settings in every thread** (``CompileGate.thread_setup``): since torch 2.12,
   ``torch._dynamo.config`` / ``torch._inductor.config`` writes are per-thread (ContextVar;
   a new thread starts from the defaults), so the settings below are applied in each thread
   that runs compiled code. Among them ``fail_on_recompile_limit_hit``: hitting
   ``recompile_limit`` must be an error, never dynamo's silent fallback to eager flex (the
   dense path).

``compile.gate: false`` keeps the race's unguarded pattern -- lazy compile per device on
first use, lock around creating the compiled object only, no warm-up, no call lock, no
stance -- ONLY to reproduce and diagnose the failure. Never train with it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Iterator

from .settings import CacheSettings

RECOMPILE_TEXT = "Detected recompile when torch.compile stance is 'fail_on_recompile'"
COUNTER_KEYS = {  # (counters section, key) -> report name
    ("inductor", "fxgraph_cache_hit"): "fxgraph_cache_hit",
    ("inductor", "fxgraph_cache_miss"): "fxgraph_cache_miss",
    ("inductor", "fxgraph_cache_bypass"): "fxgraph_cache_bypass",
    ("aot_autograd", "autograd_cache_hit"): "autograd_cache_hit",
    ("aot_autograd", "autograd_cache_miss"): "autograd_cache_miss",
    ("aot_autograd", "autograd_cache_bypass"): "autograd_cache_bypass",
    ("stats", "unique_graphs"): "unique_graphs",
    ("dynamo_cache", "dynamo_cache_hit"): "dynamo_cache_hit",      # compile.precompile
    ("dynamo_cache", "dynamo_cache_miss"): "dynamo_cache_miss",
    ("dynamo_cache", "dynamo_cache_error"): "dynamo_cache_error",
}
#: phase name -> torch's ``dynamo_timed`` keys (``torch._dynamo.utils.compilation_time_metrics``,
#: what ``compile_times()`` prints; the same names on torch 2.11 and 2.13). ``dynamo`` is all of
#: dynamo's compile of a frame; ``backend`` the part spent in AOT autograd + inductor (so
#: dynamo's own tracing and guards are ``dynamo - backend``); ``inductor_load`` loading compiled
#: modules from the cache; ``precompile_load`` the precompile cache's entry load and guards.
PHASE_KEYS = {
    "dynamo": ("_compile.compile_inner",),
    "backend": ("OutputGraph.call_user_compiler",),
    "aot": ("create_aot_dispatcher_function",),
    "inductor_compile": ("fx_codegen_and_compile",),
    "inductor_load": ("PyCodeCache.load_by_key_path",),
    "backward_compile": ("compile_fx.<locals>.bw_compiler",),
    "precompile_load": ("after_deserialization", "precompile_load_guards",
                        "precompile_build_guards"),
}


class RecompileAfterWarmup(RuntimeError):
    """torch wanted to compile after the gate was sealed: a shape or device not warmed up."""


def default_dynamo_settings(n_compiles_per_fn: int) -> dict[str, object]:
    """Dynamo settings for a run that warms ``n_compiles_per_fn`` variants of each function."""
    limit = max(8, n_compiles_per_fn + 2)
    return {
        "recompile_limit": limit,
        "accumulated_recompile_limit": max(256, 4 * limit),
        "fail_on_recompile_limit_hit": True,  # never fall back silently to eager flex
    }


def apply_dynamo_settings(settings: dict[str, object]) -> None:
    """Apply dynamo config settings in the CALLING thread (they are per-thread on torch>=2.12)."""
    import torch._dynamo.config as dcfg

    for k, v in settings.items():
        if hasattr(dcfg, k):
            setattr(dcfg, k, v)


def counters_snapshot() -> dict[str, int]:
    """The compile-cache counters from ``torch._dynamo.utils.counters`` (process totals)."""
    from torch._dynamo.utils import counters

    return {name: int(counters[sec][key]) for (sec, key), name in COUNTER_KEYS.items()}


AOT_CACHE_LOGGER = "torch._functorch._aot_autograd.autograd_cache"


class BypassReasons(logging.Handler):
    """Collects AOT-autograd's cache-bypass reasons while active (a context manager).

    torch logs "Bypassing autograd cache due to: <reason>" at INFO; when that logger is not
    already at INFO (no TORCH_LOGS), it is raised to INFO for the duration with propagation
    off, so nothing extra is printed.
    """

    def __init__(self):
        super().__init__(logging.INFO)
        self.reasons: list[str] = []
        self._saved: tuple[int, bool] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - never break a compile over a log line
            return
        if "Bypassing autograd cache" in msg:
            why = " ".join(msg.split("due to:", 1)[-1].split())
            if why not in self.reasons:
                self.reasons.append(why[:300])

    def __enter__(self) -> "BypassReasons":
        lg = logging.getLogger(AOT_CACHE_LOGGER)
        if not lg.isEnabledFor(logging.INFO):
            self._saved = (lg.level, lg.propagate)
            lg.setLevel(logging.INFO)
            lg.propagate = False
        lg.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        lg = logging.getLogger(AOT_CACHE_LOGGER)
        lg.removeHandler(self)
        if self._saved is not None:
            lg.setLevel(self._saved[0])
            lg.propagate = self._saved[1]
            self._saved = None


def counters_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


def compile_times_snapshot() -> dict[str, float]:
    """Seconds per ``dynamo_timed`` key so far in this process (``compile_times()``'s data)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics as m
    except ImportError:  # pragma: no cover - a torch without it
        return {}
    return {k: float(sum(v)) for k, v in list(m.items())}


def phases_delta(before: dict[str, float], after: dict[str, float],
                 seconds: float) -> dict[str, float]:
    """The warm-up unit's time by phase (PHASE_KEYS), plus ``dynamo_trace`` (dynamo's own
    work: ``dynamo - backend - precompile_load``) and ``other`` (``seconds - dynamo``: the
    eager parts, running the compiled code, the backward)."""
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    out = {name: round(sum(d.get(k, 0.0) for k in keys), 3) for name, keys in PHASE_KEYS.items()}
    out["dynamo_trace"] = round(max(0.0, out["dynamo"] - out["backend"] - out["precompile_load"]), 3)
    out["other"] = round(max(0.0, seconds - out["dynamo"]), 3)
    return out


@dataclass
class WarmupTask:
    """One warm-up unit: run every compiled callable on ``device`` at ``shape`` (fwd+bwd)."""
    device: str
    shape: tuple[int, ...]
    run: Callable[[], None]
    what: str = "drafter step"


@dataclass
class WarmupRecord:
    device: str
    shape: list[int]
    what: str
    seconds: float
    counters: dict[str, int] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)   # phases_delta

    def to_json(self) -> dict:
        return asdict(self)


class CompileGate:
    """One per process, made by the layout and installed on the process's compile registry
    (trainer.compile.registry.CompileRegistry.install_gate). See the module docstring for
    what ``enabled`` buys."""

    def __init__(self, enabled: bool = True, settings: dict[str, object] | None = None, *,
                 cache: CacheSettings | None = None):
        """``settings``: dynamo's (``default_dynamo_settings``); ``cache``: the process's
        compile cache settings (its registry's ``cache``; None: the defaults)."""
        self.enabled = enabled
        self.cache = cache if cache is not None else CacheSettings()
        self.settings = dict(settings or {})
        self._lock = threading.RLock()
        self.sealed = False
        self.warmed: set[tuple[str, tuple[int, ...]]] = set()
        self.records: list[WarmupRecord] = []
        self.waits = 0  # guard entries that found the lock held (contention, for reports)
        self._tl = threading.local()  # the batch shape this thread last checked

    # -- per thread -------------------------------------------------------------------------
    def thread_setup(self) -> None:
        """Call first in every thread that runs compiled code (incl. the warm-up thread).

        Gate off keeps the race's pattern for dynamo (torch's defaults). The compile
        CACHE settings (``trainer.compile.settings.CacheSettings.apply``) are applied in both
        modes: they are part of the cache keys, so a gate-on retry hits what a gate-off attempt
        built.
        """
        self.cache.apply()
        if self.enabled:
            apply_dynamo_settings(self.settings)

    # -- warm-up ----------------------------------------------------------------------------
    def warmup(self, tasks: Iterable[WarmupTask], *, heartbeat=None,
               on_record: Callable[[WarmupRecord], None] | None = None) -> list[WarmupRecord]:
        """Run every task sequentially in this thread; record time and cache counters each.

        ``heartbeat``: a context manager active during the warm-up (the trainer passes
        ``trainer.telemetry.metrics.Heartbeat``, which beats only while the process makes progress).
        """
        if self.sealed:
            raise RuntimeError("compile gate: warm-up after seal (warm up before workers start)")
        self.thread_setup()
        with heartbeat if heartbeat is not None else contextlib.nullcontext():
            for task in tasks:
                before, times0 = counters_snapshot(), compile_times_snapshot()
                t0 = time.perf_counter()
                task.run()
                _sync(task.device)
                secs = time.perf_counter() - t0
                rec = WarmupRecord(device=task.device, shape=list(task.shape), what=task.what,
                                   seconds=round(secs, 3),
                                   counters=counters_delta(before, counters_snapshot()),
                                   phases=phases_delta(times0, compile_times_snapshot(), secs))
                self.records.append(rec)
                self.warmed.add((task.device, tuple(task.shape)))
                if on_record is not None:
                    on_record(rec)
        return self.records

    def seal(self) -> None:
        """After warm-up: forbid every compile from now on (only when the gate is enabled)."""
        if not self.enabled:
            return
        import torch

        torch.compiler.set_stance("fail_on_recompile")
        self.sealed = True

    def unseal(self) -> None:
        """Back to the default stance (end of run, tests)."""
        if self.sealed:
            import torch

            torch.compiler.set_stance("default")
            self.sealed = False

    # -- after warm-up ----------------------------------------------------------------------
    def check_shape(self, device: str, shape: tuple[int, ...]) -> None:
        """Fail fast, before any compiled call, for a (device, shape) that was not warmed."""
        self._tl.batch = (str(device), tuple(shape))
        if self.sealed and (str(device), tuple(shape)) not in self.warmed:
            raise RecompileAfterWarmup(self._shape_message(str(device), tuple(shape)))

    def _shape_message(self, device: str, shape: tuple[int, ...], detail: str = "") -> str:
        warmed = sorted({s for d, s in self.warmed if d == device}) or "none"
        msg = (f"compile gate: shape {_fmt_shape(shape)} on {device} was not warmed up, and "
               f"compiling after warm-up is forbidden (warmed on {device}: {warmed}); add the "
               f"shape to data.seq_buckets/data.anchor_buckets")
        return msg + (f"; torch: {detail}" if detail else "")

    @contextlib.contextmanager
    def guard(self, what: str = "compiled call", shapes: Iterable | None = None) -> Iterator[None]:
        """Around every call into compiled code. Sealed: process-wide lock + clear recompile error.

        Unsealed (warm-up itself, or gate off) it only translates nothing and locks nothing,
        which is exactly the race's unguarded pattern when the gate is off.
        """
        if not (self.enabled and self.sealed):
            yield
            return
        if not self._lock.acquire(blocking=False):
            self.waits += 1
            self._lock.acquire()
        try:
            yield
        except RuntimeError as e:
            if RECOMPILE_TEXT in str(e) and not isinstance(e, RecompileAfterWarmup):
                first = str(e).strip().splitlines()
                detail = " ".join(line.strip() for line in first[:1] + [
                    ln for ln in first if "mismatch" in ln or "guard" in ln][:2])
                shp = _describe_shapes(shapes)
                batch = getattr(self._tl, "batch", None)
                if batch is not None:
                    shp += f", batch {_fmt_shape(batch[1])} on {batch[0]}"
                raise RecompileAfterWarmup(
                    f"compile gate: {what} needed a compile after warm-up "
                    f"(input shapes {shp}); compiling after warm-up is forbidden: add the shape "
                    f"to data.seq_buckets/data.anchor_buckets; torch: {detail}") from e
            raise
        finally:
            self._lock.release()

    def call(self, fn: Callable, *args, what: str | None = None, **kwargs):
        """``fn(*args, **kwargs)`` inside ``guard`` (shapes taken from tensor args)."""
        with self.guard(what or str(getattr(fn, "__name__", "compiled call")), shapes=args):
            return fn(*args, **kwargs)

    def report(self) -> list[dict]:
        return [r.to_json() for r in self.records]


def describe(rec: WarmupRecord) -> str:
    """One readable line per warmed unit (device, shape, time, cache counters)."""
    c = rec.counters
    return (f"warmup: {rec.device} {_fmt_shape(tuple(rec.shape))} {rec.what}: {rec.seconds:.2f} s"
            f"  fxgraph hit {c.get('fxgraph_cache_hit', 0)} miss {c.get('fxgraph_cache_miss', 0)}"
            f"  autograd hit {c.get('autograd_cache_hit', 0)} miss "
            f"{c.get('autograd_cache_miss', 0)} bypass {c.get('autograd_cache_bypass', 0)}"
            + (f"  dynamo cache hit {c.get('dynamo_cache_hit', 0)} miss {c.get('dynamo_cache_miss', 0)}"
               f" error {c.get('dynamo_cache_error', 0)}"
               if any(c.get(k) for k in ('dynamo_cache_hit', 'dynamo_cache_miss', 'dynamo_cache_error'))
               else "")
            + (f"\nwarmup:   phases: {describe_phases(rec.phases)}" if rec.phases else ""))


def describe_phases(p: dict[str, float]) -> str:
    """``dynamo 4.8 s (trace 1.7, backend 3.1: aot 2.9, inductor load 2.9), ...`` in one line."""
    g = lambda k: p.get(k, 0.0)  # noqa: E731
    return (f"dynamo {g('dynamo'):.2f} s (trace {g('dynamo_trace'):.2f}, precompile load "
            f"{g('precompile_load'):.2f}, backend {g('backend'):.2f}: aot {g('aot'):.2f}, inductor "
            f"compile {g('inductor_compile'):.2f}, inductor load {g('inductor_load'):.2f}), backward "
            f"compile {g('backward_compile'):.2f}, other {g('other'):.2f}")


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def _fmt_shape(shape: tuple[int, ...]) -> str:
    if len(shape) == 2:
        return f"(seq_len={shape[0]}, anchors={shape[1]})"
    return str(tuple(shape))


def _describe_shapes(args) -> str:
    if args is None:
        return "unknown"
    out = []
    for a in args:
        s = getattr(a, "shape", None)
        if s is not None:
            out.append(tuple(int(x) for x in s))
    return ", ".join(str(s) for s in out) if out else "unknown"
