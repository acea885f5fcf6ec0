"""``dfo diagnose``: classify a saved log offline and say which fallback dfo would choose.

A log inside its run directory (``runs/<id>/attempt-<n>.log``, beside ``spec.json`` and
``events.jsonl``) is answered the supervisor's way: its class is the one the supervisor
recorded for that attempt (a hang is judged from silence while the attempt runs, which no
log shows), and the fallback comes from ``common.verdict.choose`` over the run's own config,
ladders and ladder position. A log alone is answered over what it assumes (the default
ladders over ``--config`` or the trainer's defaults), and says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfo_contract import events as ev
from dfo_contract import runstate as rs
from dfo_contract.errors import ContractError
from dfo_contract.failure_classes import TABLES
from dfo_contract.runspec import RunSpec
from dfo_contract.state_records import Overrides, copied
from dfo_contract.trainer_markers import DoneMarker, HeartbeatMarker, TrainerMarker, read_marker

from ..config.runconfig import load_config
from ..common.errors import ConfigError
from ..common.classify import classify
from ..common.launch_argv import flatten
from ..common.verdict import Ladders, Verdict, choose, position_before

#: classes only a ddp run shows (a log alone is assumed to be ddp's)
COLLECTIVE_CLASSES = TABLES.collective

#: what a log alone cannot tell: how an attempt ended that printed no failure and no exit
UNKNOWABLE = ("the log ends without an exit status or a failure line: from the log alone a "
              "crash cannot be told from a hang (the supervisor judges compile_hang from the "
              "attempt's silence and idle process while it runs); diagnose the log inside its "
              "run directory (runs/<id>/attempt-<n>.log), or pass --exit-code")


@dataclass
class RunView:
    """What the run's own records say about the attempt whose log this is."""
    run_id: str
    attempt: int
    cls: str | None = None          # the supervisor's class for the attempt (events.jsonl)
    reason: str | None = None
    applied: str | None = None      # the fallback step it applied ("" = restart unchanged)
    gave_up: str | None = None      # its give-up reason, when it ended the run there

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "attempt": self.attempt, "class": self.cls,
                "reason": self.reason, "applied": self.applied, "gave_up": self.gave_up}


@dataclass
class DiagnoseReport:
    diagnosis: Any                 # common.classify's result for the log: cls, reason, evidence
    fallback: Verdict | None       # common.verdict's choice; None: the run finished, or unknown
    cls: str = ""                  # the class the fallback answers (the supervisor's, given a run)
    run: RunView | None = None
    assumed: str = ""              # what the answer assumed (a log without its run)
    unknown: str = ""              # what the log alone cannot tell
    alternatives: dict[str, Verdict] = field(default_factory=dict)

    def to_json(self) -> dict:
        out = self.diagnosis.to_json()
        out["log_class"] = out["class"]
        out["class"] = self.cls or out["class"]
        out["fallback"] = self.fallback.to_json() if self.fallback else None
        out["run"] = self.run.to_json() if self.run else None
        out["assumed"] = self.assumed or None
        out["unknown"] = self.unknown or None
        out["alternatives"] = {k: v.to_json() for k, v in self.alternatives.items()}
        return out


def last_marker(lines: list[str]) -> TrainerMarker | None:
    """The last ``@dfo`` marker of a log (``DoneMarker``, ``StepMarker``, ...), or None.
    Heartbeats are skipped: they may follow the final marker while the process exits."""
    for ln in reversed(lines):
        m = read_marker(ln)
        if m is not None and not isinstance(m, HeartbeatMarker):
            return m
    return None


def diagnose(logfile: str | Path, *, exit_code: int | None = None,
             config: str | Path | None = None,
             run_file: str | Path | None = None) -> DiagnoseReport:
    """The class of the failure in ``logfile``, its evidence lines, and the fallback dfo
    chooses for it: the run's own answer when the log lies in its run directory, else the
    default ladder's first step over ``config`` (else the trainer's defaults); with
    ``run_file`` (your own trainer's, docs/own-trainer.md) the first step of its ladder."""
    try:
        text = Path(logfile).read_text(errors="replace")
    except OSError as e:
        raise ConfigError(f"{logfile}: cannot read: {e.strerror or e}") from None
    lines = text.splitlines()
    if exit_code is None and isinstance(last_marker(lines), DoneMarker):
        exit_code = 0  # the trainer said it finished: no exit code needed to know that
    d = classify(lines, exit_code=exit_code, own=run_file is not None)
    run = None if (config or run_file) else _run_of(Path(logfile))
    if run is not None:
        return _in_run(d, *run)
    if run_file:
        from ..config.own_runfile import read_run_file

        fb = read_run_file(str(run_file))[0].get("fallbacks") or {}
        ladders = Ladders(own=True, own_steps={k: tuple(v) for k, v in fb.items()})
        assumed = f"the ladders of {run_file} from the start (no earlier fallback)"
    else:
        if config:
            base = flatten(load_config(config)[0])
            where = str(config)
        else:  # the trainer's defaults (torch-free)
            from dfo_contract.trainer_config import TrainerConfig

            base = flatten(TrainerConfig().to_dict())
            where = "the trainer's defaults"
            if d.cls in COLLECTIVE_CLASSES:   # collectives: the log is a ddp run's
                base["parallel.layout"] = "ddp"
                where += " with parallel.layout=ddp (the log's collectives are ddp's)"
        ladders = Ladders.assumed(base)
        gate = base.get("compile.gate")
        assumed = (f"the default ladders over {where} (compile.gate={gate}, parallel.layout="
                   f"{base.get('parallel.layout')}), from the start; the log is not in a run "
                   "directory: the run's own config may differ")
    out = DiagnoseReport(d, None, d.cls, assumed=assumed)
    if d.cls == "done":
        return out
    if exit_code is None and not d.evidence and d.cls == "crash":
        out.unknown = UNKNOWABLE
        out.alternatives = {c: choose(ladders, c, 0, {}) for c in ("crash", "compile_hang")}
        return out
    out.fallback = choose(ladders, d.cls, 0, {})
    return out


def _run_of(log: Path) -> tuple[RunSpec, list[ev.Event], int, str] | None:
    """(spec, events, attempt, run id) when ``log`` is an attempt log in its run directory."""
    n = rs.attempt_of_log(log.name)
    run_dir = log.resolve().parent
    spec_p, events_p = run_dir / rs.SPEC_FILE, run_dir / rs.EVENTS_FILE
    if n is None or not spec_p.is_file():
        return None
    try:
        spec = _spec(spec_p)
        evs = ev.read_events(events_p.read_text()) if events_p.is_file() else []
    except (OSError, ValueError, ContractError) as e:
        raise ConfigError(f"{run_dir}: the run's records cannot be read ({e})",
                          hint="pass --config to diagnose the log alone") from None
    return spec, evs, n, os.path.basename(run_dir)


def _spec(path: Path) -> RunSpec:
    """A run's spec.json (OSError, ValueError or ContractError when unreadable)."""
    return RunSpec.from_json(json.loads(path.read_text()))


def _in_run(d, spec: RunSpec, evs: list[ev.Event], n: int, run_id: str) -> DiagnoseReport:
    view = RunView(run_id, n)
    started: dict[int, Overrides] = {}
    classes: dict[int, str] = {}
    fell_back: list[int] = []
    for e in evs:
        if isinstance(e, ev.AttemptStart):
            started[e.attempt] = copied(e.overrides)
        elif isinstance(e, ev.Classified):
            classes[e.attempt] = e.cls
            if e.attempt == n:
                view.cls, view.reason = e.cls, e.reason
        elif isinstance(e, ev.Fallback):
            fell_back.append(e.attempt)
            if e.attempt == n:
                view.applied = e.step or ""
        elif isinstance(e, ev.GiveUp) and view.cls and view.applied is None \
                and classes.get(n) == e.cls:
            view.gave_up = e.reason
    cls = view.cls or d.cls
    out = DiagnoseReport(d, None, cls, run=view)
    if cls == "done":
        return out
    if view.cls is None and not d.evidence and d.cls == "crash":
        out.unknown = UNKNOWABLE.split(";")[0] + (
            "; the supervisor has not classified this attempt (yet)")
    ladders = Ladders.from_spec(spec)
    earlier = [(classes[m], started.get(m, {})) for m in fell_back if m < n and m in classes]
    pos = position_before(ladders, cls, earlier)
    out.fallback = choose(ladders, cls, pos, started.get(n, dict(spec.config.overrides)))
    return out
