"""What ``dfo status`` and ``dfo stop`` read from a host: the replies of
``python -m orchestrator.supervisor.query`` (one JSON line each).

- :class:`RunStatus`: one run as ``dfo status`` sees it: its ``state.json``
  (:class:`~dfo_contract.runstate.RunState`, its attempts without their argv) and what the
  host adds: whether its supervisor lives, the status to show, the current step, the
  tokens/s trend, the time account (:class:`~dfo_contract.goodput.Goodput`). Its JSON is
  state.json's object with those keys beside its keys (``dfo status --json``'s runs).
- :class:`QueryReply`: every run asked for, and who holds ``run.lock``.
- :class:`StopReply`: whether a stop signal was sent, and why not.

``from_json`` keeps the keys it does not know (``extra``, a run's in its RunState) and
``to_json`` writes them back, as RunState does; it raises ValueError for what is not a reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

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


def _object(obj: Any, what: str) -> Mapping:
    if not isinstance(obj, Mapping):
        raise ValueError(f"{what} is not a JSON object")
    return obj


def _opt(kind: type | tuple[type, ...], v: Any, key: str) -> Any:
    """``v`` when it is None or a ``kind`` (a bool is no number here); ValueError otherwise."""
    if v is not None and (not isinstance(v, kind) or isinstance(v, bool) and kind is not bool):
        raise ValueError(f"{key!r} has the wrong type ({type(v).__name__})")
    return v


@dataclass(frozen=True)
class RunStatus:
    """One run on a host as ``dfo status`` shows it (module doc)."""

    state: RunState
    #: the status to show: state.json's, ``lost`` or ``never_started``
    shown_status: str
    #: its supervisor process exists and is this run's
    live: bool = False
    run_dir: str | None = None
    #: the line that says state.json is damaged (the state is then rebuilt from its events)
    state_damaged: str | None = None
    #: where the notice lies of a supervisor that could not write its run directory
    notice: str | None = None
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
    version: int = STATUS_VERSION

    #: the keys this record writes beside state.json's
    KEYS = ("live", "run_dir", "notice", "shown_status", "state_damaged", "now",
            "recent_tokens_per_s", "time", "beat_age_s", "not_responding",
            "status_version")

    @property
    def run_id(self) -> str:
        return self.state.run_id

    def to_json(self) -> dict:
        out = self.state.to_json()
        for a in out["attempts"]:
            a.pop("argv", None)
        out.update(live=self.live, run_dir=self.run_dir)
        if self.notice is not None:
            out["notice"] = self.notice
        out["shown_status"] = self.shown_status
        if self.state_damaged is not None:
            out["state_damaged"] = self.state_damaged
        out.update(now=self.now, recent_tokens_per_s=list(self.recent_tokens_per_s),
                   time=None if self.time is None else self.time.to_json(),
                   beat_age_s=self.beat_age_s, not_responding=self.not_responding,
                   status_version=self.version)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "RunStatus":
        obj = _object(obj, "a run's status")
        state = RunState.from_json({k: v for k, v in obj.items() if k not in cls.KEYS})
        recent = obj.get("recent_tokens_per_s")
        recent = [] if recent is None else recent
        if not isinstance(recent, list):
            raise ValueError("'recent_tokens_per_s' is not a list")
        try:   # the time account only adds a figure: one that cannot be read is none
            t = Goodput.from_json(obj["time"]) if obj.get("time") is not None else None
        except ValueError:
            t = None
        return cls(state=state,
                   shown_status=str(obj.get("shown_status") or state.status),
                   live=bool(obj.get("live")),
                   run_dir=_opt(str, obj.get("run_dir"), "run_dir"),
                   state_damaged=_opt(str, obj.get("state_damaged"), "state_damaged"),
                   notice=_opt(str, obj.get("notice"), "notice"),
                   now=_opt((int, float), obj.get("now"), "now"),
                   recent_tokens_per_s=tuple(x for x in recent if isinstance(x, (int, float))
                                             and not isinstance(x, bool)),
                   time=t,
                   beat_age_s=_opt((int, float), obj.get("beat_age_s"), "beat_age_s"),
                   not_responding=_opt(str, obj.get("not_responding"), "not_responding"),
                   version=int(obj.get("status_version", STATUS_VERSION)))


@dataclass(frozen=True)
class QueryReply:
    """``--root R [--run ID]``: the runs asked for (by run id) and ``run.lock``'s owner."""

    runs: tuple[RunStatus, ...] = ()
    lock_owner: str | None = None
    version: int = QUERY_VERSION
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**self.extra, "runs": [r.to_json() for r in self.runs],
                "lock_owner": self.lock_owner, "version": self.version}

    @classmethod
    def from_json(cls, obj: Any) -> "QueryReply":
        obj = _object(obj, "the run query's reply")
        runs = obj.get("runs")
        runs = [] if runs is None else runs
        if not isinstance(runs, list):
            raise ValueError("the run query's 'runs' is not a list")
        return cls(runs=tuple(RunStatus.from_json(r) for r in runs),
                   lock_owner=_opt(str, obj.get("lock_owner"), "lock_owner"),
                   version=int(obj.get("version", QUERY_VERSION)),
                   extra={k: v for k, v in obj.items()
                          if k not in ("runs", "lock_owner", "version")})


@dataclass(frozen=True)
class StopReply:
    """``--stop ID``: ``stopped`` (SIGTERM sent to the supervisor ``pid``), else ``why`` not
    and the run's shown ``status`` when it has one."""

    stopped: bool
    why: str | None = None
    status: str | None = None
    pid: int | None = None
    version: int = STOP_VERSION
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**self.extra, "stopped": self.stopped, "why": self.why, "status": self.status,
                "pid": self.pid, "version": self.version}

    @classmethod
    def from_json(cls, obj: Any) -> "StopReply":
        obj = _object(obj, "the stop reply")
        if not isinstance(obj.get("stopped"), bool):
            raise ValueError("the stop reply lacks 'stopped'")
        names = ("stopped", "why", "status", "pid", "version")
        return cls(stopped=obj["stopped"], why=_opt(str, obj.get("why"), "why"),
                   status=_opt(str, obj.get("status"), "status"),
                   pid=_opt(int, obj.get("pid"), "pid"),
                   version=int(obj.get("version", STOP_VERSION)),
                   extra={k: v for k, v in obj.items() if k not in names})
