"""``dfo diagnose``: classify a saved log offline and say which fallback dfo would choose."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.runconfig import load_config
from ..errors import ConfigError
from ..ops.classify import classify, parse_marker
from ..ops.fallback import DEFAULT_LADDERS, next_config
from ..ops.launch_inputs import flatten


@dataclass
class Diagnosis:
    diagnosis: Any        # ops.classify's result: cls, reason, evidence
    fallback: Any | None  # ops.fallback's choice, None when the run finished

    def to_json(self) -> dict:
        out = self.diagnosis.to_json()
        out["fallback"] = self.fallback.to_json() if self.fallback else None
        return out


def last_marker_kind(lines: list[str]) -> str | None:
    """The kind of the last ``@dfo`` marker in a log (``done``, ``step``, ...), or None.
    Heartbeats are skipped: they may follow the final marker while the process exits."""
    for ln in reversed(lines):
        rec = parse_marker(ln)
        if rec is not None and rec.get("kind") != "heartbeat":
            return rec.get("kind")
    return None


def diagnose(logfile: str | Path, *, exit_code: int | None = None,
             config: str | Path | None = None, run_file: str | Path | None = None) -> Diagnosis:
    """The class of the failure in ``logfile``, its evidence lines, and the first fallback
    of the default ladder for it, evaluated against ``config`` (else the trainer's defaults);
    with ``run_file`` (a foreign trainer's, docs/byo-trainer.md) the first step of its
    ladder for that class."""
    try:
        text = Path(logfile).read_text(errors="replace")
    except OSError as e:
        raise ConfigError(f"{logfile}: cannot read: {e.strerror or e}") from None
    lines = text.splitlines()
    if exit_code is None and last_marker_kind(lines) == "done":
        exit_code = 0  # the trainer said it finished: no exit code needed to know that
    d = classify(lines, exit_code=exit_code)
    if run_file:
        from ..ops import byo
        from ..config.byo_runfile import read_run_file

        ladder = (read_run_file(str(run_file))[0].get("fallbacks") or {}).get(d.cls, [])
        c = None if d.cls == "done" else byo.next_step(d.cls, ladder, 0, byo.Changes())
        return Diagnosis(d, c and _ByoFallback(c))
    if config:
        base = flatten(load_config(config)[0])
    else:  # the trainer's defaults (torch-free)
        from dfo_contract.trainer_config import TrainerConfig

        base = flatten(TrainerConfig().to_dict())
    choice = None
    if d.cls != "done":
        choice = next_config(d.cls, DEFAULT_LADDERS.get(d.cls, []), 0, base, {})
    return Diagnosis(d, choice)


@dataclass
class _ByoFallback:
    """A foreign trainer's ladder step, shaped for the CLI like ``ops.fallback.Choice``."""

    choice: Any
    restore_cache: bool = False

    @property
    def step(self):
        return self.choice.step

    @property
    def exhausted(self):
        return self.choice.exhausted

    @property
    def changed(self):
        return self.choice.changed

    def to_json(self) -> dict:
        return {"class": self.choice.cls, "step": self.choice.step,
                "changed": self.choice.changed, "exhausted": self.choice.exhausted,
                "restore_cache": False}
