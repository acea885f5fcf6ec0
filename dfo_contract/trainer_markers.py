"""The bundled trainer's ``@dfo`` markers as types (torch-free): what the trainer prints and
what the supervisor's watchdog, the goodput clock, the classifier, ``dfo logs`` and
``dfo diagnose`` read.

Each marker is a frozen dataclass with a ``KIND``, read and written by the records' codec
(``dfo_contract.codec``; non-finite floats are written as null). ``to_record()`` is its JSON
object on the wire (``{"kind": ..., "v": MARKER_VERSION, <fields>, "t": ...}``, one ``@dfo``
line by ``markers.format_marker``), and ``read_marker(line)`` parses a line once into one of
them. A record from another trainer (or an older one) reads leniently: a field missing or of
the wrong type reads as None (an empty tuple where the field is one; items of the wrong type
are left out of it), a kind this module does not know is an ``OtherMarker``, and nothing
raises. A NaN loss another trainer prints (``NaN``, ``"nan"``) reads as NaN: it is news.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Mapping, Self

from . import codec
from .markers import format_marker, parse_marker

MARKER_VERSION = 1


def _absent(cls: type) -> dict[str, Any]:
    """What each field of the marker class ``cls`` reads as where a record lacks it or has
    it mistyped: None, an empty tuple for a tuple."""
    return {f.name: () if f.default == () else None for f in fields(cls)}


@dataclass(frozen=True)
class _Marker:
    KIND: ClassVar[str] = ""
    NONFINITE: ClassVar[str] = codec.AS_NULL
    TOLERANT: ClassVar[bool] = True
    t: float | None = None                   # the trainer's wall clock when it printed it

    def to_record(self) -> dict[str, Any]:
        """The marker's JSON object (``codec.encode``): ``kind``, ``v``, its fields, ``t``
        (now, where the marker has none); non-finite floats as null."""
        rec = codec.encode(self)
        t = rec.pop("t")
        return {"kind": self.KIND, "v": MARKER_VERSION, **rec,
                "t": time.time() if self.t is None else t}

    def line(self) -> str:
        """The marker's ``@dfo`` line."""
        return format_marker(self.to_record())

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Self:
        """The marker of one record of its kind (``codec.decode``, tolerant; the module's
        lenient reading)."""
        return codec.decode(cls, rec, what=f"a {cls.KIND or 'trainer'} marker", **_absent(cls))


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
    acc_per_pos: tuple[float, ...] = codec.filtered(())

    @property
    def loss_is_nan(self) -> bool:
        return self.loss is not None and not math.isfinite(self.loss)


@dataclass(frozen=True)
class CheckpointMarker(_Marker):
    KIND: ClassVar[str] = "checkpoint"
    step: int | None = None
    path: str | None = None


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


@dataclass(frozen=True)
class BestMarker(_Marker):
    """A new best acceptance length, checkpointed and pointed to."""
    KIND: ClassVar[str] = "best"
    step: int | None = None
    accept_len: float | None = None


@dataclass(frozen=True)
class HeartbeatMarker(_Marker):
    KIND: ClassVar[str] = "heartbeat"
    phase: str | None = None
    step: int | None = None


@dataclass(frozen=True)
class PhaseMarker(_Marker):
    KIND: ClassVar[str] = "phase"
    phase: str | None = None


@dataclass(frozen=True)
class StartupMarker(_Marker):
    """Start-up done: the training loop begins at ``step`` after ``total_s``, in ``phases``
    (``(name, seconds)`` in order: spawn, layout, data, resume, warm-up)."""
    KIND: ClassVar[str] = "startup"
    step: int | None = None
    total_s: float | None = None
    phases: tuple[tuple[str, float], ...] = codec.filtered(())

    def to_record(self) -> dict[str, Any]:
        """``phases`` on the wire is the object ``{name: seconds}``, in order."""
        rec = super().to_record()
        rec["phases"] = dict(rec["phases"])
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Self:
        ph = rec.get("phases")
        return super().from_record(
            {**rec, "phases": list(ph.items()) if isinstance(ph, Mapping) else None})

    def phase_s(self, name: str) -> float:
        return dict(self.phases).get(name, 0.0)


@dataclass(frozen=True)
class DoneMarker(_Marker):
    KIND: ClassVar[str] = "done"
    step: int | None = None


@dataclass(frozen=True)
class OtherMarker(_Marker):
    """A marker of a kind not listed here (a bench's report, another tool's record)."""
    kind: str = ""
    record: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_record(self) -> dict[str, Any]:
        """The record as read, with its ``kind`` as a string (non-finite floats as null)."""
        return {**codec.encode(self)["record"], "kind": self.kind}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Self:
        """Any record: its ``t``, its ``kind`` as a string, the record kept whole."""
        return cls(t=_Marker.from_record(rec).t, kind=str(rec.get("kind")), record=dict(rec))


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
        return OtherMarker.from_record(rec)
    return cls.from_record(rec)


def read_marker(line: str) -> TrainerMarker | None:
    """The marker of one output line, or None when the line is not a (well-formed) marker."""
    rec = parse_marker(line)
    return None if rec is None else from_record(rec)
