"""``metrics.jsonl``: the trainer's log-step and evaluation records (docs/contracts.md,
"metrics.jsonl"), written by ``trainer.telemetry.metrics`` and read by ``dfo status``
(the step and the tokens/s trend) and ``dfo plot`` (the curves).

One JSON object per line, appended in one ``write(2)`` (``fsio.append_jsonl``):
``{"v": 1, "step": ..., <the phase's fields>, "phase": ..., "attempt": ..., <extra>}``,
read and written by the records' codec (``dfo_contract.codec``; non-finite numbers are
written as null). A reader parses each line once into a :class:`MetricsRecord`, tolerantly
(a field of the wrong type reads as None); a line without an integer ``step`` (torn, or not
a record) or of another version is skipped, and a record without ``v`` reads as version 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Iterable, Mapping

from . import codec
from .errors import ContractError
from .fsio import parse_jsonl
from .trainer_markers import EvalMarker, StepMarker

METRICS_FILE = "metrics.jsonl"
#: the format version of every record this dfo writes
VERSION = 1

#: the numeric fields of a training step's record, in the order they are written
TRAIN_FIELDS = ("loss", "acc", "tau", "lr", "tokens_per_s", "samples_per_s", "peak_mem_bytes")
#: the numeric fields of a held-out evaluation's record (``phase: eval``)
EVAL_FIELDS = ("accept_len", "best_accept_len", "eval_blocks", "eval_s")


def _finite(v: Any) -> float | None:
    """A finite number as float, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


@dataclass(frozen=True)
class MetricsRecord:
    """One line of metrics.jsonl: a training step's metrics (``phase`` ``train``) or a
    held-out evaluation (``phase`` ``eval``). ``extra``: further numeric fields a trainer
    logged, as ``(name, value)`` in the order written (read: the further keys that hold a
    number)."""
    NONFINITE: ClassVar[str] = codec.AS_NULL
    TOLERANT: ClassVar[bool] = True
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
    acc_per_pos: tuple[float, ...] = codec.filtered(())
    accept_len: float | None = None
    best_accept_len: float | None = None
    eval_blocks: int | None = None
    eval_s: float | None = None
    #: an evaluation's target: ``served`` (full precision, as the engines serve it) or
    #: ``fp8`` (the training target's fp8 layers, ``model.target_fp8``); None: the one target
    eval_target: str | None = None
    extra: tuple[tuple[str, float | None], ...] = codec.filtered(())

    def to_json(self) -> dict[str, Any]:
        """The line's object (``codec.encode``, in the order of the module's line): a step
        record carries every training field (null when not measured), an evaluation its own;
        ``acc_per_pos`` when not empty, the other optional ones when set, then ``extra``."""
        enc = codec.encode(self)
        named, other = ((EVAL_FIELDS, TRAIN_FIELDS) if self.phase == "eval"
                        else (TRAIN_FIELDS, EVAL_FIELDS))
        keys = ("step", *named, "phase", "attempt", *(("acc_per_pos",) if self.acc_per_pos else ()),
                *(("eval_target",) if self.eval_target is not None else ()),
                *(n for n in other if getattr(self, n) is not None), *(k for k, _ in self.extra))
        return {"v": VERSION, **{k: enc[k] for k in keys}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MetricsRecord | None":
        """The record of one parsed line (``codec.decode``, tolerant; ``extra``: the keys
        that hold a number); None when it is no record this version reads."""
        if d.get("v", VERSION) != VERSION:
            return None
        try:
            rec = codec.decode(cls, {k: v for k, v in d.items() if k != "v"},
                               what="a metrics.jsonl record")
        except ContractError:       # no integer step
            return None
        if any(v is None for _, v in rec.extra):
            rec = replace(rec, extra=tuple((k, v) for k, v in rec.extra if v is not None))
        return rec

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
            return _finite(getattr(self, name))
        return _finite(dict(self.extra).get(name))

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
