"""A run's files: the ``state.json`` schema (:class:`RunState`) and the files' names.

``events.jsonl`` records are typed events: ``dfo_contract.events``; what ``dfo status``
reads of a run (this state and what the host adds) is ``dfo_contract.status``.

Pure: formats and names only; reading and writing them is orchestrator.supervisor.runfiles.

``<root>/runs/<run-id>/``::

    spec.json        what launch asked for (written once by launch, read by the supervisor)
    state.json       the supervisor's current view; replaced atomically on every change
    events.jsonl     one JSON object per decision, appended with a single write
    attempt-<n>.log  the trainer's stdout+stderr for attempt n
    supervisor.log   the supervisor's own output
    metrics.jsonl    the trainer's step records (run.dir)
    stacks/          stack dumps taken before a hung attempt was killed

Statuses: ``starting`` -> ``running`` <-> ``backoff`` -> ``stopping`` -> final
``done`` | ``failed`` | ``stopped``. ``dfo status`` shows ``lost`` when state.json says the
run is live but its supervisor process is gone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from dataclasses import fields as dc_fields
from typing import Any, Mapping

STATE_VERSION = 1
SPEC_FILE = "spec.json"
STATE_FILE = "state.json"
EVENTS_FILE = "events.jsonl"
SUPERVISOR_LOG = "supervisor.log"
STACKS_DIR = "stacks"

LIVE = ("starting", "running", "backoff", "stopping")
FINAL = ("done", "failed", "stopped")
STATUSES = LIVE + FINAL

_ATTEMPT_LOG = re.compile(r"^attempt-(\d+)\.log$")


def attempt_log_name(n: int) -> str:
    return f"attempt-{n}.log"


def attempt_of_log(name: str) -> int | None:
    m = _ATTEMPT_LOG.match(name)
    return int(m.group(1)) if m else None


def _split(cls: type, obj: Any, what: str) -> tuple[dict, dict]:
    """(known fields, the rest) of a JSON object; the rest is kept so a round trip through
    an older supervisor loses no key a newer one wrote."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"{what} is not a JSON object")
    names = {f.name for f in dc_fields(cls)} - {"extra"}
    known = {k: v for k, v in obj.items() if k in names}
    return known, {k: v for k, v in obj.items() if k not in names}


def _to_json(obj: Any) -> dict:
    out = {f.name: getattr(obj, f.name) for f in dc_fields(obj) if f.name != "extra"}
    return {**obj.extra, **out}


@dataclass
class Attempt:
    """One trainer attempt (an element of state.json's ``attempts``)."""

    n: int
    started_at: float
    ended_at: float | None = None
    resume: str | None = None
    overrides: dict = field(default_factory=dict)
    argv: list = field(default_factory=list)
    log: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    cls: str | None = None        # the classifier's class
    reason: str | None = None
    #: it reached its first training step (None: not recorded)
    reached_train: bool | None = None
    #: the run's newest checkpoint changed while it ran (None: not recorded)
    checkpointed: bool | None = None
    #: the run's compile cache grew while it ran (a compile got further; None: not recorded)
    cache_grew: bool | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return _to_json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "Attempt":
        known, rest = _split(cls, obj, "an attempt")
        if "n" not in known or "started_at" not in known:
            raise ValueError("an attempt lacks 'n' or 'started_at'")
        return cls(**known, extra=rest)


@dataclass
class RunState:
    """The supervisor's view of one run: state.json, key for key (``to_json``/``from_json``)."""

    run_id: str
    run_name: str | None = None
    version: int = STATE_VERSION
    status: str = "starting"
    reason: str | None = None
    evidence: list = field(default_factory=list)
    pid: int | None = None
    mode: str | None = None                  # "systemd" | "setsid"
    started_at: float | None = None
    updated_at: float | None = None
    ended_at: float | None = None
    attempt: int = 0                         # the number of the latest attempt
    attempts: list[Attempt] = field(default_factory=list)
    overrides: dict = field(default_factory=dict)   # config overrides in force (dotted keys)
    fallbacks: list = field(default_factory=list)   # [{"class", "step", "changed", "attempt"}]
    ladder_pos: dict = field(default_factory=dict)  # class -> position on its ladder
    budget: dict = field(default_factory=dict)      # common.budget.BudgetState.to_json()
    last_step: int | None = None
    tokens_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    baseline_overrides: dict | None = None   # the overrides the baseline was measured with
    last_startup_failure_overrides: dict | None = None
    last_checkpoint: dict | None = None      # {"step", "path"}
    #: the bundled trainer's measured acceptance length (eval markers) and its best so far
    accept_len: float | None = None
    best_accept_len: float | None = None
    #: while tokens/s is low without dense evidence: {"cause", "summary", "since", "attempt"}
    throughput_low: dict | None = None
    trainer_pids: list = field(default_factory=list)
    #: the standby interpreter's pid (supervisor.standby), None when there is none
    standby_pid: int | None = None
    last_event: str | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def new(cls, run_id: str, run_name: str, *, now: float) -> "RunState":
        return cls(run_id=run_id, run_name=run_name, started_at=now, updated_at=now)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def to_json(self) -> dict:
        out = _to_json(self)
        out["attempts"] = [a.to_json() for a in self.attempts]
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "RunState":
        """state.json's object -> RunState (ValueError when it is not one)."""
        known, rest = _split(cls, obj, "state.json")
        if "run_id" not in known:
            raise ValueError("state.json lacks 'run_id'")
        attempts = known.get("attempts") or []
        if not isinstance(attempts, list):
            raise ValueError("state.json's 'attempts' is not a list")
        known["attempts"] = [Attempt.from_json(a) for a in attempts]
        return cls(**known, extra=rest)


def new_state(run_id: str, run_name: str, *, now: float) -> dict:
    """A fresh state.json object (``RunState.new(...).to_json()``)."""
    return RunState.new(run_id, run_name, now=now).to_json()


def validate_state(obj: Any) -> dict:
    """Minimal schema check for a state.json read from a host."""
    if not isinstance(obj, dict) or obj.get("version") != STATE_VERSION:
        raise ValueError("not a dfo state.json (version mismatch)")
    for k in ("run_id", "status", "attempt", "attempts"):
        if k not in obj:
            raise ValueError(f"state.json lacks {k!r}")
    if obj["status"] not in STATUSES:
        raise ValueError(f"state.json has unknown status {obj['status']!r}")
    return obj


def final_exit_code(status: str) -> int:
    """Exit code for ``dfo logs -f`` / ``dfo launch -f`` when the run ends: done and stopped
    give 0, failed gives RunFailed's 10 (raised by the caller)."""
    return 10 if status == "failed" else 0
