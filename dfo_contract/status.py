"""What ``dfo status`` and ``dfo stop`` read from a host: the replies of
``python -m orchestrator.supervisor.query`` (one JSON line each).

- :class:`RunStatus`: one run as ``dfo status`` sees it: its ``state.json``
  (:class:`~dfo_contract.runstate.RunState`, its attempts without their argv) and what the
  host adds: whether its supervisor lives, the status to show, the current step, the
  tokens/s trend, the time account (:class:`~dfo_contract.goodput.Goodput`). Its JSON is
  state.json's object with those keys beside its keys (``dfo status --json``'s runs).
- :class:`QueryReply`: every run asked for, and who holds ``run.lock``.
- :class:`StopReply`: whether a stop signal was sent, and why not.

They are read and written by ``dfo_contract.codec``: ``from_json`` keeps the keys it does not
know (``extra``, a run's in its RunState) and ``to_json`` writes them back; it raises
ContractError (a ValueError) for what is not a reply.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from .codec import decode, encode, flat, json_name, named, opt
from .goodput import Goodput
from .runstate import RunState

STATUS_VERSION = 1
QUERY_VERSION = 1
STOP_VERSION = 1

#: ``shown_status`` beyond state.json's statuses: the run is live by its state.json but its
#: supervisor is gone; its directory has a spec.json but its supervisor never started
LOST = "lost"
NEVER_STARTED = "never_started"
#: ``shown_status`` of a live run whose supervisor's heartbeat is older than its
#: ``silent_s`` (dfo_contract.beat): the process exists but runs no code (SIGSTOP, ...)
NOT_RESPONDING = "not_responding"


@dataclass(frozen=True)
class RunStatus:
    """One run on a host as ``dfo status`` shows it (module doc). Read tolerant: a field of
    the wrong type reads as its default, as state.json's do."""

    TOLERANT = True

    #: state.json's object, the host's keys beside its keys; its attempts carry no argv
    state: RunState = flat()
    #: its supervisor process exists and is this run's
    live: bool = False
    run_dir: str | None = None
    #: where the notice lies of a supervisor that could not write its run directory
    notice: str | None = opt()
    #: the status to show: state.json's, ``lost``, ``never_started`` or ``not_responding``
    #: ("" when built: state.json's)
    shown_status: str = ""
    #: the line that says state.json is damaged (the state is then rebuilt from its events)
    state_damaged: str | None = opt()
    #: the host's clock when it answered
    now: float | None = None
    #: the newest tokens/s of metrics.jsonl, oldest first (the trend)
    recent_tokens_per_s: tuple[float, ...] = ()
    #: goodput and the time lost per cause (None: the events could not be read)
    time: Goodput | None = None
    #: seconds since the live supervisor's heartbeat (None: not live, or no heartbeat)
    beat_age_s: float | None = None
    #: the line that says the supervisor is not responding and what to do (else None)
    not_responding: str | None = None
    version: int = named("status_version", STATUS_VERSION)

    def __post_init__(self) -> None:
        if any(a.argv is not None for a in self.state.attempts):
            state = dataclasses.replace(self.state, attempts=[
                dataclasses.replace(a, argv=None) for a in self.state.attempts])
            object.__setattr__(self, "state", state)
        if not self.shown_status:
            object.__setattr__(self, "shown_status", self.state.status)

    @property
    def run_id(self) -> str:
        return self.state.run_id

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "RunStatus":
        """A run's object -> RunStatus (ContractError, a ValueError, when it is not one); a
        time account that cannot be read is none (it only adds a figure)."""
        if isinstance(obj, Mapping) and obj.get("time") is not None:
            try:
                Goodput.from_json(obj["time"])
            except ValueError:
                obj = {**obj, "time": None}
        return decode(cls, obj, what="a run's status")


#: the keys a run's status writes beside state.json's
STATUS_KEYS = tuple(json_name(f) for f in dataclasses.fields(RunStatus) if f.name != "state")


@dataclass(frozen=True)
class QueryReply:
    """``--root R [--run ID]``: the runs asked for (by run id) and ``run.lock``'s owner."""

    runs: tuple[RunStatus, ...] = ()
    lock_owner: str | None = None
    version: int = QUERY_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "QueryReply":
        return decode(cls, obj, what="the run query's reply")


@dataclass(frozen=True)
class StopReply:
    """``--stop ID``: ``stopped`` (SIGTERM sent to the supervisor ``pid``), else ``why`` not
    and the run's shown ``status`` when it has one."""

    stopped: bool
    why: str | None = None
    status: str | None = None
    pid: int | None = None
    version: int = STOP_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "StopReply":
        return decode(cls, obj, what="the stop reply")
