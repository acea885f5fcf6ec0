"""The bundled trainer's ``@dfo`` markers as types (torch-free): what the trainer prints and
what the supervisor's watchdog, the goodput clock, the classifier, ``dfo logs`` and
``dfo diagnose`` read.

Each marker is a frozen dataclass with a ``KIND``; ``to_record()`` is its JSON object on the
wire (``{"kind": ..., "v": MARKER_VERSION, <fields>, "t": ...}``, one ``@dfo`` line by
``markers.format_marker``), and ``read_marker(line)`` parses a line once into one of them.
A record from another trainer (or an older one) reads leniently: a field of the wrong type
reads as None, a kind this module does not know is an ``OtherMarker``, and nothing raises.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Mapping

from .markers import format_marker, parse_marker

MARKER_VERSION = 1


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    """A finite or non-finite float (a NaN loss is news), or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _finite(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else None


@dataclass(frozen=True)
class _Marker:
    KIND: ClassVar[str] = ""
    t: float | None = None                   # the trainer's wall clock when it printed it

    def to_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"kind": self.KIND, "v": MARKER_VERSION}
        for f in fields(self):
            if f.name != "t":
                v = getattr(self, f.name)
                rec[f.name] = list(v) if isinstance(v, tuple) else v
        rec["t"] = self.t if self.t is not None else time.time()
        return rec

    def line(self) -> str:
        """The marker's ``@dfo`` line (non-finite floats as null)."""
        rec = {k: (_finite(v) if isinstance(v, float) else v) for k, v in self.to_record().items()}
        return format_marker(rec)


@dataclass(frozen=True)
class StepMarker(_Marker):
    """One optimizer step's metrics (also ``metrics.jsonl``'s training record)."""
    KIND: ClassVar[str] = "step"
    step: int | None = None
    loss: float | None = None
    acc: float | None = None
    tau: float | None = None
    lr: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    peak_mem_bytes: int | None = None
    phase: str | None = "train"
    attempt: int | None = None
    acc_per_pos: tuple[float, ...] = ()

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> "StepMarker":
        app = rec.get("acc_per_pos")
        return cls(t=_num(rec.get("t")), step=_int(rec.get("step")), loss=_num(rec.get("loss")),
                   acc=_num(rec.get("acc")), tau=_num(rec.get("tau")), lr=_num(rec.get("lr")),
                   tokens_per_s=_num(rec.get("tokens_per_s")),
                   samples_per_s=_num(rec.get("samples_per_s")),
                   peak_mem_bytes=_int(rec.get("peak_mem_bytes")), phase=_str(rec.get("phase")),
                   attempt=_int(rec.get("attempt")),
                   acc_per_pos=tuple(x for x in (_num(a) for a in app) if x is not None)
                   if isinstance(app, list) else ())

    @property
    def loss_is_nan(self) -> bool:
        return self.loss is not None and not math.isfinite(self.loss)


@dataclass(frozen=True)
class CheckpointMarker(_Marker):
    KIND: ClassVar[str] = "checkpoint"
    step: int | None = None
    path: str | None = None

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> "CheckpointMarker":
        return cls(t=_num(rec.get("t")), step=_int(rec.get("step")), path=_str(rec.get("path")))


@dataclass(frozen=True)
class EvalMarker(_Marker):
    """A held-out evaluation (also ``metrics.jsonl``'s ``phase: eval`` record)."""
    KIND: ClassVar[str] = "eval"
    step: int | None = None
    accept_len: float | None = None
    best_accept_len: float | None = None
    eval_blocks: int | None = None
    eval_s: float | None = None
    eval_target: str | None = None   # served | fp8 (metrics_record.MetricsRecord.eval_target)
    phase: str | None = "eval"
    attempt: int | None = None

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> "EvalMarker":
        return cls(t=_num(rec.get("t")), step=_int(rec.get("step")),
                   accept_len=_num(rec.get("accept_len")),
                   best_accept_len=_num(rec.get("best_accept_len")),
                   eval_blocks=_int(rec.get("eval_blocks")), eval_s=_num(rec.get("eval_s")),
                   eval_target=_str(rec.get("eval_target")),
                   phase=_str(rec.get("phase")), attempt=_int(rec.get("attempt")))


@dataclass(frozen=True)
class BestMarker(_Marker):
    """A new best acceptance length, checkpointed and pointed to."""
    KIND: ClassVar[str] = "best"
    step: int | None = None
    accept_len: float | None = None

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> "BestMarker":
        return cls(t=_num(rec.get("t")), step=_int(rec.get("step")),
                   accept_len=_num(rec.get("accept_len")))


@dataclass(frozen=True)
class HeartbeatMarker(_Marker):
    KIND: ClassVar[str] = "heartbeat"
    phase: str | None = None
    step: int | None = None

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> "HeartbeatMarker":
        return cls(t=_num(rec.get("t")), phase=_str(rec.get("phase")), step=_int(rec.get("step")))


@dataclass(frozen=True)
class PhaseMarker(_Marker):
    KIND: ClassVar[str] = "phase"
    phase: str | None = None

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> "PhaseMarker":
        return cls(t=_num(rec.get("t")), phase=_str(rec.get("phase")))


@dataclass(frozen=True)
class StartupMarker(_Marker):
    """Start-up done: the training loop begins at ``step`` after ``total_s``, in ``phases``
    (``(name, seconds)`` in order: spawn, layout, data, resume, warm-up)."""
    KIND: ClassVar[str] = "startup"
    step: int | None = None
    total_s: float | None = None
    phases: tuple[tuple[str, float], ...] = ()

    def to_record(self) -> dict[str, Any]:
        rec = super().to_record()
        rec["phases"] = {n: s for n, s in self.phases}
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> "StartupMarker":
        ph = rec.get("phases")
        phases = tuple((str(n), float(s)) for n, s in ph.items() if _num(s) is not None) \
            if isinstance(ph, Mapping) else ()
        return cls(t=_num(rec.get("t")), step=_int(rec.get("step")),
                   total_s=_num(rec.get("total_s")), phases=phases)

    def phase_s(self, name: str) -> float:
        return dict(self.phases).get(name, 0.0)


@dataclass(frozen=True)
class DoneMarker(_Marker):
    KIND: ClassVar[str] = "done"
    step: int | None = None

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> "DoneMarker":
        return cls(t=_num(rec.get("t")), step=_int(rec.get("step")))


@dataclass(frozen=True)
class OtherMarker(_Marker):
    """A marker of a kind not listed here (a bench's report, another tool's record)."""
    kind: str = ""
    record: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_record(self) -> dict[str, Any]:
        return {**self.record, "kind": self.kind}


TrainerMarker = (StepMarker | CheckpointMarker | EvalMarker | BestMarker | HeartbeatMarker
                 | PhaseMarker | StartupMarker | DoneMarker | OtherMarker)

_KnownMarker = (type[StepMarker] | type[CheckpointMarker] | type[EvalMarker] | type[BestMarker]
                | type[HeartbeatMarker] | type[PhaseMarker] | type[StartupMarker] | type[DoneMarker])

KINDS: dict[str, _KnownMarker] = {c.KIND: c for c in (StepMarker, CheckpointMarker, EvalMarker, BestMarker,
                                               HeartbeatMarker, PhaseMarker, StartupMarker,
                                               DoneMarker)}


def from_record(rec: Mapping[str, Any]) -> TrainerMarker:
    """The typed marker of one record (never raises)."""
    kind = rec.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return OtherMarker(t=_num(rec.get("t")), kind=str(kind), record=dict(rec))
    return cls.from_record(rec)


def read_marker(line: str) -> TrainerMarker | None:
    """The marker of one output line, or None when the line is not a (well-formed) marker."""
    rec = parse_marker(line)
    return None if rec is None else from_record(rec)
