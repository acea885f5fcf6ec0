"""Metrics and progress output: ``@dfo {json}`` markers, metrics.jsonl, heartbeats.

- ``Emitter.emit(marker)`` prints a typed marker (``dfo_contract.trainer_markers``) as one
  ``@dfo {"kind": ..., "v": 1, ..., "t": ...}`` line on stdout (flushed); the supervisor
  parses only these lines.
- ``Emitter.step(measured)`` appends the step's ``dfo_contract.metrics_record.MetricsRecord``
  to ``<run.dir>/metrics.jsonl``, writes its numeric fields to a TensorBoard event file
  beside it (``trainer.telemetry.tbevents``), prints it as a marker and as one readable
  line. ``Emitter.eval(measured)`` does the same for a held-out evaluation (``phase: eval``,
  ``accept_len``, ``best_accept_len``).
- ``Heartbeat``: a thread printing ``{"kind": "heartbeat", "phase": ..., "step": ...}`` at
  least every ``every_s`` (<= 10) seconds while the process is doing work: when its CPU
  time advanced by >= 10% of one core, or a step finished, since the last beat. A
  deadlocked or sleeping process (or one hung by fault injection) emits none, so a
  supervisor can tell "compiling" from "hung".

Metric tensors stay on the device; ``.item()``/``.tolist()`` happen only at log steps
(``to_host``), one synchronization per log line.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from typing import Any, Callable, Mapping

from dfo_contract.fsio import append_jsonl
from dfo_contract.metrics_record import METRICS_FILE, MetricsRecord
from dfo_contract.trainer_markers import HeartbeatMarker, PhaseMarker, TrainerMarker
from dfo_contract.procs import proc_stat

from .tbevents import ScalarWriter


class Emitter:
    def __init__(self, run_dir: str | None, *, attempt: int = 1, out=None, enabled: bool = True,
                 silenced: Callable[[], bool] | None = None):
        """``silenced``: true once nothing more may be printed (fault injection's ``hang``:
        trainer.telemetry.faults.Faults.silenced); None: never."""
        self.run_dir = run_dir
        self._silenced = silenced
        self.attempt = attempt
        self._out = out
        self.enabled = enabled
        self._lock = threading.Lock()
        self.phase = "init"
        self.metrics_path = os.path.join(run_dir, METRICS_FILE) if run_dir else None
        if run_dir and enabled:
            os.makedirs(run_dir, exist_ok=True)
        self._tb = ScalarWriter(run_dir) if run_dir and enabled else None

    @property
    def out(self):
        return self._out or sys.stdout

    def print(self, text: str) -> None:
        self._write(text + "\n")

    def _write(self, line: str) -> None:
        if not self.enabled or (self._silenced is not None and self._silenced()):
            return
        with self._lock:
            # one write per line: ranks of a ddp run share the pipe, and a line written in
            # one call (< PIPE_BUF) is never interleaved with another process's line
            out = self.out
            out.write(line)
            out.flush()

    def emit(self, marker: TrainerMarker) -> None:
        self._write(marker.line())

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.emit(PhaseMarker(phase=phase))

    def _record(self, rec: MetricsRecord) -> None:
        """``rec`` into metrics.jsonl and the TensorBoard events, and as its marker."""
        if self.metrics_path and self.enabled:
            with self._lock:
                append_jsonl(self.metrics_path, rec.to_json())
            if self._tb is not None:
                prefix = "eval/" if rec.phase == "eval" else ""
                self._tensorboard(rec.step, {f"{prefix}{k}": v
                                             for k, v in rec.scalars().items()})
        self.emit(rec.marker())

    def step(self, measured: Mapping[str, Any] | MetricsRecord) -> None:
        """One log step's metrics (``MetricsRecord`` fields; ``phase: train``)."""
        rec = measured if isinstance(measured, MetricsRecord) else MetricsRecord.of(measured)
        self._record(rec)
        self.print(f"step {rec.step:>6}  loss {_fmt(rec.loss)}  acc {_fmt(rec.acc)}  "
                   f"tau {_fmt(rec.tau, 2)}  lr {_fmt(rec.lr, 3, 'g')}  "
                   f"{_fmt(rec.tokens_per_s, 0)} tok/s  {_fmt(rec.samples_per_s, 2)} samples/s")

    def _tensorboard(self, step: int, values: Mapping[str, Any]) -> None:
        if self._tb is None:
            return
        try:
            self._tb.write(step, values)
        except OSError as e:  # pictures must never stop training
            self._tb = None
            self.print(f"tensorboard events disabled: {e}")

    def eval(self, measured: Mapping[str, Any]) -> None:
        """A held-out evaluation (``accept_len``: measured acceptance length): one record in
        metrics.jsonl with ``"phase": "eval"``, an ``eval`` marker and one readable line."""
        rec = MetricsRecord.of(measured, phase="eval", attempt=self.attempt)
        self._record(rec)
        on = {"served": ", full-precision target as served",
              "fp8": ", fp8 target as trained"}.get(rec.eval_target or "", "")
        self.print(f"eval {rec.step:>6}  accept_len {_fmt(rec.accept_len, 3)}  "
                   f"best {_fmt(rec.best_accept_len, 3)}  ({rec.eval_blocks} blocks{on})")


def _fmt(x, nd: int = 4, how: str = "f") -> str:
    return "nan" if x is None or x != x else f"{x:.{nd}{how}}"


def peak_mem_bytes(device) -> int:
    """Peak allocated bytes on a CUDA device; peak RSS of the process on CPU."""
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def to_host(summary: dict) -> dict:
    """One device->host copy of the summary tensors (loss, acc, tau, acc_per_pos)."""
    import torch

    scalars = torch.stack([summary["loss"].float(), summary["acc"].float(), summary["tau"].float()])
    loss, acc, tau = scalars.tolist()
    return {"loss": loss, "acc": acc, "tau": tau, "acc_per_pos": summary["acc_per_pos"].tolist()}


def cpu_seconds() -> float:
    """CPU seconds of this process, its reaped children and its live children (compile workers)."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    return total + _live_children_cpu()


def _live_children_cpu() -> float:
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    pids: set[str] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(f.read().split())
    except OSError:
        return 0.0
    stats = [proc_stat(pid) for pid in pids]
    return sum(st.utime + st.stime for st in stats if st is not None) / tick


class Heartbeat:
    """Background heartbeat while the process makes progress (see the module docstring)."""

    def __init__(self, emitter: Emitter, *, every_s: float = 5.0):
        self.em = emitter
        self.every_s = min(float(every_s), 10.0)
        self.step = 0
        self._progress = 0
        self._stop = threading.Event()
        self._th: threading.Thread | None = None
        self.beats = 0
        self.windows = 0     # every_s windows judged so far (beat or not)

    def progress(self, step: int | None = None) -> None:
        """Call when the main thread finished a unit of work (a step, a compile)."""
        if step is not None:
            self.step = step
        self._progress += 1

    def _loop(self) -> None:
        last_cpu, last_prog = cpu_seconds(), self._progress
        while not self._stop.wait(self.every_s):
            cpu, prog = cpu_seconds(), self._progress
            # >= 10% of one core since the last beat: working (a deadlock or sleep uses ~0)
            if cpu - last_cpu >= 0.1 * self.every_s or prog != last_prog:
                self.beats += 1
                self.em.emit(HeartbeatMarker(phase=self.em.phase, step=self.step))
            last_cpu, last_prog = cpu, prog
            self.windows += 1

    def start(self) -> "Heartbeat":
        self._th = threading.Thread(target=self._loop, name="dfo-heartbeat", daemon=True)
        self._th.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._th is not None:
            self._th.join(timeout=2.0)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class Startup:
    """Where an attempt's start went, phase by phase, up to its training loop.

    ``origin`` is when the attempt began: the supervisor's spawn (``$DFO_SPAWN_T``) or else the
    process's own start, so the first phase ("spawn", up to ``train()``) holds the interpreter,
    the imports and the config. ``mark(name)`` closes the phase that ran since the last mark.
    """

    def __init__(self, origin: float | None):
        self.t0 = time.time()
        self.phases: list[tuple[str, float]] = []
        if origin is not None and origin <= self.t0:
            self.phases.append(("spawn", self.t0 - origin))
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.phases.append((name, now - self._last))
        self._last = now

    def total(self) -> float:
        return sum(s for _, s in self.phases)

    def line(self) -> str:
        parts = ", ".join(f"{n} {s:.1f} s" for n, s in self.phases)
        return f"startup: {self.total():.1f} s to the training loop ({parts})"

    def fields(self) -> dict:
        return {"total_s": round(self.total(), 3),
                "phases": {n: round(s, 3) for n, s in self.phases}}
