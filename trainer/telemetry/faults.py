"""Fault injection: a documented test facility, off by default.

The supervisor's tests and the demo recover from these faults; each one is the real
thing, not a printed imitation (see docs/contracts.md, "Fault injection").

Spec (``DFO_FAULT`` or ``--fault.spec``; the flag wins): comma-separated
``KIND[=ARG]@STEP[#ATTEMPT]``. ``#ATTEMPT`` defaults to ``1`` (first attempt only);
``#*`` means every attempt. Kinds:

``fx_race``   torch itself raises ``Detected that you are using FX to symbolically trace a
              dynamo-optimized function``: a thread is inside ``torch.fx.symbolic_trace``
              (held there until the error came) while this thread calls compiled code
              (torch <= 2.13 keeps the tracing flag process-global). It bypasses the
              compile gate on purpose.
``hang``      the process stays alive, makes no progress and prints nothing more: heartbeats
              stop too (``Faults.silenced()`` turns true and stdout/stderr writes block); SIGTERM
              and SIGINT are ignored (like a native deadlock), only SIGKILL ends it.
``oom``       raises ``torch.OutOfMemoryError``.
``exit=N``    exits at once with code N (0..255); ``sigkill`` kills itself with SIGKILL.
``slow=F``    from STEP on, each step is stretched so throughput is F (0 < F < 1) of what
              it was, and flex_attention's own dense-path warning ("... materializes the full
              scores matrix ...") is printed, by calling uncompiled flex_attention once.
``nan``       the loss of that step becomes NaN (``Effects.nan``; the loop applies it).

The parser is ``dfo_contract.faultspec`` (torch-free; the config validates the spec with it);
torch is imported only when a fault fires. The state (hang's silence, slow's throttle) is a
``Faults`` object, one per process (trainer.core.runtime.Runtime holds it); ``$DFO_FAULT`` and
``$DFO_ATTEMPT`` come from the caller's ``trainer.env.Env`` (read by ``trainer.env.read_env``
when none is given).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from dfo_contract import faultspec
from dfo_contract.faultspec import (ENV_VAR, FX_RACE_TEXT, KINDS, Fault, FaultSpecError,  # noqa: F401
                                     parse_spec)

from ..env import Env, read_env


@dataclass
class Effects:
    """What the caller must apply to this step (only ``nan`` needs the loop's help)."""
    nan: bool = False
    fired: list[str] = field(default_factory=list)

    def apply_to_loss(self, loss):
        """Return ``loss`` made NaN when the ``nan`` fault fired (keeps the autograd graph)."""
        return loss * float("nan") if self.nan else loss


class Faults:
    """Fault injection's state in one process: hang's silence, slow's throttle, parsed specs."""

    def __init__(self):
        self._silenced = threading.Event()
        self._lock = threading.Lock()
        self._slow_fraction: float | None = None
        self._slow_last: float | None = None
        self._parsed: dict[str, list[Fault]] = {}

    def silenced(self) -> bool:
        """True once the ``hang`` fault fired: heartbeat emitters must print nothing more."""
        return self._silenced.is_set()

    def _faults_of(self, spec) -> list[Fault]:
        if not spec:
            return []
        if isinstance(spec, str):
            if spec not in self._parsed:
                self._parsed[spec] = parse_spec(spec)
            return self._parsed[spec]
        return list(spec)

    def maybe_inject(self, step: int, *, attempt: int | None = None, spec=None,
                     compiled_call: Callable[[], object] | None = None) -> Effects:
        """Call once per optimizer step, before the step's work, from the loop's main thread.

        ``spec``: a spec string or parsed faults (None: nothing fires). ``attempt`` defaults
        to ``$DFO_ATTEMPT`` (read now). ``compiled_call``: a zero-argument callable that enters
        a torch.compile'd function (used by ``fx_race``; a tiny eager-backend compiled function
        is used when it is None). Returns the effects the loop must apply to this step.
        """
        faults = self._faults_of(spec)
        effects = Effects()
        self._throttle()
        if not faults:
            return effects
        if attempt is None:
            attempt = read_env().attempt
        for f in faults:
            if not f.matches(step, attempt):
                continue
            effects.fired.append(str(f))
            _announce(f, step, attempt)
            if f.kind == "nan":
                effects.nan = True
            elif f.kind == "slow":
                self.start_slow(float(f.value))
            elif f.kind == "exit":
                _flush()
                os._exit(int(f.value))
            elif f.kind == "sigkill":
                _flush()
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(60)  # SIGKILL is asynchronous on some kernels; never return
            elif f.kind == "oom":
                raise_oom(step)
            elif f.kind == "hang":
                self.hang()
            elif f.kind == "fx_race":
                raise_fx_race(compiled_call)
        return effects

    def hang(self) -> None:
        """Never returns: no progress, no output from any Python thread (heartbeats included).

        SIGTERM and SIGINT are ignored, as by a process deadlocked in native code: only SIGKILL
        ends it (faulthandler's stack-dump signals still work).
        """
        _flush()
        self._silenced.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                signal.signal(sig, signal.SIG_IGN)
            except ValueError:  # not the main thread: handlers stay as they are
                pass
        sys.stdout = _BlockingStream(sys.stdout)
        sys.stderr = _BlockingStream(sys.stderr)
        while True:  # alive and silent
            time.sleep(3600)

    def start_slow(self, fraction: float) -> None:
        """From now on stretch each step to 1/fraction of its time; print flex's dense warning."""
        print_dense_flex_warning()
        with self._lock:
            self._slow_fraction = fraction
            self._slow_last = time.perf_counter()

    def _throttle(self) -> None:
        with self._lock:
            frac, last = self._slow_fraction, self._slow_last
        if frac is None or last is None:
            return
        worked = time.perf_counter() - last
        time.sleep(max(0.0, worked * (1.0 / frac - 1.0)))
        with self._lock:
            self._slow_last = time.perf_counter()


def resolve_spec(flag_value: str | None, env: Env | None = None) -> str | None:
    """The active spec text: the ``--fault.spec`` flag if set, else ``$DFO_FAULT`` (``env``'s;
    None: read now)."""
    return faultspec.resolve_spec(flag_value, (env or read_env()).fault)


def _announce(f: Fault, step: int, attempt: int) -> None:
    print(f"fault injection: {f.kind} at step {step} (attempt {attempt}, spec {f})",
          file=sys.stderr, flush=True)


def _flush() -> None:
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:  # noqa: BLE001 - best effort before an abrupt exit
            pass


# --------------------------------------------------------------------------- the faults

def raise_oom(step: int) -> None:
    import torch
    raise torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 20.00 GiB. "
        f"(raised by fault injection oom@{step}; no memory was actually exhausted)")


class _BlockingStream:
    """Replaces stdout/stderr during ``hang``: every write blocks forever."""

    def __init__(self, inner):
        self._inner = inner

    def write(self, s):
        threading.Event().wait()

    def flush(self):
        return None

    def __getattr__(self, name):
        return getattr(self._inner, name)



def print_dense_flex_warning() -> None:
    """Make torch's own flex_attention dense-path warning appear on stderr.

    Calls uncompiled flex_attention on a tiny CPU input (the real code path), forcing its
    warn-once to fire again, and prints the warning it emits.
    """
    import warnings

    import torch
    from torch.nn.attention import flex_attention as fa

    shown = getattr(fa, "_WARNINGS_SHOWN", None)
    if isinstance(shown, set):
        shown.discard("flex_attention_performance")
    q = torch.zeros(1, 1, 16, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # eager flex still enters dynamo (eager backend): allow it past a sealed gate
        with torch.compiler.set_stance("default"):
            fa.flex_attention(q, q, q)
    msgs = [str(w.message) for w in caught if "materializes" in str(w.message)]
    if not msgs:  # a torch without the warning: say what it would have said
        msgs = ["flex_attention called without torch.compile() - this will use an unfused "
                "implementation that materializes the full scores matrix instead of "
                "generating a fused kernel."]
    for m in msgs:
        print(f"{fa.__file__}: UserWarning: {m}", file=sys.stderr, flush=True)


class _Hold:  # symbolic_trace target whose forward holds torch's tracing flag until released
    @staticmethod
    def module(entered: threading.Event, release: threading.Event, timeout_s: float):
        import torch

        class Hold(torch.nn.Module):
            def forward(self, x):
                entered.set()          # torch's process-global tracing flag is set now
                release.wait(timeout_s)
                return x
        return Hold()


def raise_fx_race(compiled_call: Callable[[], object] | None = None, *,
                  timeout_s: float = 60.0) -> None:
    """Make torch raise its FX-tracing RuntimeError in this thread. Never returns.

    The user's crash is a race: another thread is inside ``torch.fx.symbolic_trace`` (which
    sets torch's process-global ``_is_fx_tracing_flag``) while this one enters compiled code.
    Injected, the race is made certain rather than left to the scheduler: a daemon thread
    traces a module whose ``forward`` holds the flag set until this thread's call to compiled
    code has raised. ``compiled_call`` is the caller's compiled code (tried once outside the
    trace; a tiny compiled function, compiled before the trace, when it is missing or fails
    there). Bounded: when torch does not raise (e.g. a torch whose flag is thread-local) a
    RuntimeError says so.
    """
    import torch
    import torch.fx

    call = compiled_call
    if call is not None:
        try:
            call()
        except RuntimeError:
            call = None
    if call is None:
        call = _toy_compiled_call()
    entered, release = threading.Event(), threading.Event()
    m = _Hold.module(entered, release, timeout_s)
    th = threading.Thread(target=lambda: torch.fx.symbolic_trace(m), name="dfo-fault-fx-tracer",
                          daemon=True)
    th.start()
    try:
        if entered.wait(timeout_s):
            call()
    finally:
        release.set()
        th.join(timeout=10)   # the trace ends at once: torch's flag is restored after it
    raise RuntimeError(f"fault injection fx_race: torch {torch.__version__} did not raise the "
                       f"FX-tracing error (tracing flag thread-local?)")


def _toy_compiled_call() -> Callable[[], object]:
    """A tiny function compiled with the eager backend, compiled now (stance allowing)."""
    import torch

    def _toy(x):
        return torch.sin(x) + 1

    fn = torch.compile(_toy, backend="eager")
    x = torch.randn(8)
    with torch.compiler.set_stance("default"):
        fn(x)
    return lambda: fn(x)
