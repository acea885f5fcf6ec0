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
from typing import Any

from .codec import decode, encode, opt
from .state_records import (BudgetState, CheckpointRef, EvidenceLine, FallbackRecord,
                            Overrides, ThroughputLowState)

__all__ = ["RunState", "Attempt", "BudgetState", "CheckpointRef", "EvidenceLine", "FallbackRecord",
           "ThroughputLowState", "STATE_VERSION", "SPEC_FILE", "STATE_FILE", "EVENTS_FILE",
           "SUPERVISOR_LOG", "STACKS_DIR", "LIVE", "FINAL", "STATUSES", "attempt_log_name",
           "attempt_of_log", "new_state", "validate_state", "final_exit_code"]

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


@dataclass
class Attempt:
    """One trainer attempt (an element of state.json's ``attempts``)."""

    n: int
    started_at: float
    ended_at: float | None = None
    resume: str | None = None
    overrides: Overrides = field(default_factory=dict)
    #: None in a run's status (``dfo status`` carries no argv; not written)
    argv: list[Any] | None = opt(factory=list)
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
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "Attempt":
        return decode(cls, obj, what="an attempt", tolerant=True)


@dataclass
class RunState:
    """The supervisor's view of one run: state.json, key for key (``to_json``/``from_json``)."""

    run_id: str
    run_name: str | None = None
    version: int = STATE_VERSION
    status: str = "starting"
    reason: str | None = None
    evidence: list[EvidenceLine] = field(default_factory=list)
    pid: int | None = None
    mode: str | None = None                  # "systemd" | "setsid"
    started_at: float | None = None
    updated_at: float | None = None
    ended_at: float | None = None
    attempt: int = 0                         # the number of the latest attempt
    attempts: list[Attempt] = field(default_factory=list)
    overrides: Overrides = field(default_factory=dict)  # the config in force
    fallbacks: list[FallbackRecord] = field(default_factory=list)
    ladder_pos: dict[str, int] = field(default_factory=dict)  # class -> position on its ladder
    budget: BudgetState = field(default_factory=BudgetState)   # common.budget's decisions
    last_step: int | None = None
    tokens_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    baseline_overrides: Overrides | None = None   # the baseline was measured with them
    last_startup_failure_overrides: Overrides | None = None
    last_checkpoint: CheckpointRef | None = None
    #: the bundled trainer's measured acceptance length (eval markers) and its best so far
    accept_len: float | None = None
    best_accept_len: float | None = None
    #: while tokens/s is low without dense evidence
    throughput_low: ThroughputLowState | None = None
    trainer_pids: list[int] = field(default_factory=list)
    #: the standby interpreter's pid (supervisor.standby), None when there is none
    standby_pid: int | None = None
    last_event: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def new(cls, run_id: str, run_name: str, *, now: float) -> "RunState":
        return cls(run_id=run_id, run_name=run_name, started_at=now, updated_at=now)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def to_json(self) -> dict[str, Any]:
        """state.json's object (``codec.encode``: unknown keys kept in ``extra`` first)."""
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "RunState":
        """state.json's object -> RunState (ContractError, a ValueError, when it is not one)."""
        return decode(cls, obj, what="state.json", tolerant=True)


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
