"""``metrics.jsonl``: the trainer's log-step and evaluation records (docs/contracts.md,
"metrics.jsonl"), written by ``trainer.telemetry.metrics`` and read by ``dfo status``
(the step and the tokens/s trend) and ``dfo plot`` (the curves).

One JSON object per line, appended in one ``write(2)`` (``fsio.append_jsonl``):
``{"v": 1, "step": ..., <the phase's fields>, "phase": ..., "attempt": ..., <extra>}``;
non-finite numbers are written as null. A reader parses each line once into a
:class:`MetricsRecord`; a line without an integer ``step`` (torn, or not a record) or of another
version is skipped, and a record without ``v`` reads as version 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping

from .fsio import parse_jsonl
from .trainer_markers import EvalMarker, StepMarker

METRICS_FILE = "metrics.jsonl"
#: the format version of every record this dfo writes
VERSION = 1

#: the numeric fields of a training step's record, in the order they are written
TRAIN_FIELDS = ("loss", "acc", "tau", "lr", "tokens_per_s", "samples_per_s", "peak_mem_bytes")
#: the numeric fields of a held-out evaluation's record (``phase: eval``)
EVAL_FIELDS = ("accept_len", "best_accept_len", "eval_blocks", "eval_s")
_NAMED = {"v", "step", "phase", "attempt", "acc_per_pos", "eval_target", *TRAIN_FIELDS,
          *EVAL_FIELDS}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    """A finite number as float, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _safe(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


@dataclass(frozen=True)
class MetricsRecord:
    """One line of metrics.jsonl: a training step's metrics (``phase`` ``train``) or a
    held-out evaluation (``phase`` ``eval``). ``extra``: further numeric fields a trainer
    logged, as ``(name, value)`` in the order written."""
    step: int
    phase: str = "train"
    attempt: int | None = None
    loss: float | None = None
    acc: float | None = None
    tau: float | None = None
    lr: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    peak_mem_bytes: int | None = None
    acc_per_pos: tuple[float, ...] = ()
    accept_len: float | None = None
    best_accept_len: float | None = None
    eval_blocks: int | None = None
    eval_s: float | None = None
    #: an evaluation's target: ``served`` (full precision, as the engines serve it) or
    #: ``fp8`` (the training target's fp8 layers, ``model.target_fp8``); None: the one target
    eval_target: str | None = None
    extra: tuple[tuple[str, float | None], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The line's object: a step record carries every training field (null when not
        measured), an evaluation its own; the optional ones only when set."""
        out: dict[str, Any] = {"v": VERSION, "step": self.step}
        names = EVAL_FIELDS if self.phase == "eval" else TRAIN_FIELDS
        out.update((n, _safe(getattr(self, n))) for n in names)
        out["phase"] = self.phase
        out["attempt"] = self.attempt
        if self.acc_per_pos:
            out["acc_per_pos"] = [_safe(a) for a in self.acc_per_pos]
        if self.eval_target is not None:
            out["eval_target"] = self.eval_target
        other = TRAIN_FIELDS if self.phase == "eval" else EVAL_FIELDS
        out.update((n, _safe(getattr(self, n))) for n in other if getattr(self, n) is not None)
        out.update((n, _safe(v)) for n, v in self.extra)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MetricsRecord | None":
        """The record of one parsed line; None when it is no record this version reads."""
        step = _int(d.get("step"))
        if step is None or d.get("v", VERSION) != VERSION:
            return None
        app = d.get("acc_per_pos")
        phase = d.get("phase")
        return cls(step=step, phase=phase if isinstance(phase, str) else "train",
                   attempt=_int(d.get("attempt")), loss=_num(d.get("loss")),
                   acc=_num(d.get("acc")), tau=_num(d.get("tau")), lr=_num(d.get("lr")),
                   tokens_per_s=_num(d.get("tokens_per_s")),
                   samples_per_s=_num(d.get("samples_per_s")),
                   peak_mem_bytes=_int(d.get("peak_mem_bytes")),
                   acc_per_pos=tuple(x for x in map(_num, app) if x is not None)
                   if isinstance(app, list) else (),
                   accept_len=_num(d.get("accept_len")),
                   best_accept_len=_num(d.get("best_accept_len")),
                   eval_blocks=_int(d.get("eval_blocks")), eval_s=_num(d.get("eval_s")),
                   eval_target=d.get("eval_target") if isinstance(d.get("eval_target"), str)
                   else None,
                   extra=tuple((k, _num(v)) for k, v in d.items()
                               if k not in _NAMED and _num(v) is not None))

    @classmethod
    def of(cls, measured: Mapping[str, Any], **more: Any) -> "MetricsRecord":
        """A record to write from the trainer's measurements (attribute names; ``more``
        over ``measured``); a name that is no field goes to ``extra``."""
        kw: dict[str, Any] = {**measured, **more}
        extra = tuple((k, kw.pop(k)) for k in list(kw) if k not in _ATTRS)
        if "acc_per_pos" in kw:
            kw["acc_per_pos"] = tuple(kw["acc_per_pos"] or ())
        return cls(**kw, extra=extra)

    def names(self) -> tuple[str, ...]:
        """The numeric fields this record has a finite value for, in the order written."""
        return tuple(n for n in (*TRAIN_FIELDS, *EVAL_FIELDS, *(k for k, _ in self.extra))
                     if self.value(n) is not None)

    def value(self, name: str) -> float | None:
        """The finite number of the numeric field ``name`` (a named one or an extra)."""
        if name in TRAIN_FIELDS or name in EVAL_FIELDS:
            return _num(getattr(self, name))
        return dict(self.extra).get(name)

    def scalars(self) -> dict[str, Any]:
        """The numbers a scalar writer (TensorBoard) takes: every numeric field and
        ``acc_per_pos``, without ``v``, ``step``, ``phase``, ``attempt`` and ``eval_target``."""
        d = self.to_json()
        return {k: v for k, v in d.items()
                if k not in ("v", "step", "phase", "attempt", "eval_target")}

    def marker(self) -> StepMarker | EvalMarker:
        """The ``@dfo`` marker the trainer prints for this record."""
        if self.phase == "eval":
            return EvalMarker(step=self.step, accept_len=self.accept_len,
                              best_accept_len=self.best_accept_len,
                              eval_blocks=self.eval_blocks, eval_s=self.eval_s,
                              eval_target=self.eval_target, phase=self.phase,
                              attempt=self.attempt)
        return StepMarker(step=self.step, loss=self.loss, acc=self.acc, tau=self.tau,
                          lr=self.lr, tokens_per_s=self.tokens_per_s,
                          samples_per_s=self.samples_per_s,
                          peak_mem_bytes=self.peak_mem_bytes, phase=self.phase,
                          attempt=self.attempt, acc_per_pos=self.acc_per_pos)


_ATTRS = {f.name for f in fields(MetricsRecord)} - {"extra"}


def metrics_records(objs: Iterable[Mapping[str, Any]]) -> list[MetricsRecord]:
    """The records among parsed lines (``fsio.read_jsonl(...).records``)."""
    return [r for r in map(MetricsRecord.from_json, objs) if r is not None]


def parse_metrics(data: bytes | str) -> list[MetricsRecord]:
    """The records of metrics.jsonl's text (torn lines and lines that are not records skipped)."""
    return metrics_records(parse_jsonl(data).records)
