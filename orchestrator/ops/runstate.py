"""A run's files: the ``state.json`` schema (:class:`RunState`), ``events.jsonl`` records, names.

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

import json
import math
import re
import time
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

#: event kinds (the `kind` field of events.jsonl)
EVENT_KINDS = (
    "supervisor_start",   # pid, mode, resumed (bool)
    "attempt_start",      # attempt, resume, overrides, argv
    "checkpoint",         # attempt, step, path
    "eval",               # attempt, step, accept_len, best_accept_len (measured acceptance)
    "watchdog",           # attempt, reason (hang / collapse / live pattern)
    "throughput_low",     # attempt, reason, cause (host_busy|gpu_shared|unknown), seen, summary
    "throughput_ok",      # attempt, reason
    "stacks",             # attempt, files
    "cache_restore",      # attempt, ok, detail
    "run_first",          # attempt, commands, ok, detail (a foreign trainer's ladder)
    "attempt_end",        # attempt, exit_code, signal, duration_s
    "classified",         # attempt, class, reason, evidence
    "fallback",           # attempt, class, step, changed, overrides
    "restart",            # next attempt, delay_s, reason
    "give_up",            # class, reason, evidence
    "orphans_reaped",     # pids
    "stopping",           # reason
    "final",              # status, reason
    # a multi-node run (spec ``group``); each carries ``node`` (index) and ``host``
    "group_start",        # node, host, nodes, head_addr, coord_port
    "peer_abort",         # attempt, node, host, reason: another node's attempt failed
    "node_end",           # attempt, node, host, class, reason (one node's own judgement)
    "node_lost",          # attempt, node, host, silent_s, reason
    "group_decision",     # attempt, node, host, action, status, reason, cause (the head's)
    # the standby interpreter (supervisor.standby)
    "standby_start",      # attempt (the one it is for), pid
    "standby_ready",      # pid, import_s, modules, niced, error
    "standby_used",       # attempt, pid, import_s, age_s, log
    "standby_discarded",  # attempt, pid, reason
)

_ATTEMPT_LOG = re.compile(r"^attempt-(\d+)\.log$")


def attempt_log_name(n: int) -> str:
    return f"attempt-{n}.log"


def attempt_of_log(name: str) -> int | None:
    m = _ATTEMPT_LOG.match(name)
    return int(m.group(1)) if m else None


def clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats become strings (state/events stay strict JSON)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(clean(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def event(kind: str, t: float | None = None, **fields: Any) -> dict:
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    rec = {"t": round(time.time() if t is None else t, 3), "kind": kind}
    rec.update(fields)
    return rec


def event_line(rec: Mapping[str, Any]) -> bytes:
    """One events.jsonl record as the bytes of one line (appended with a single write)."""
    return (dumps(rec) + "\n").encode()


def read_events(text: str) -> list[dict]:
    out = []
    for ln in text.splitlines():
        ln = ln.strip()
        if not ln:
            continue
        try:
            rec = json.loads(ln)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


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
    budget: dict = field(default_factory=dict)      # ops.budget.BudgetState.to_json()
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


def describe_event(e: Mapping[str, Any]) -> str:
    """One short human line for an event (status tables, logs)."""
    k = e.get("kind")
    a = e.get("attempt")
    if k == "supervisor_start":
        return f"supervisor started ({e.get('mode')}, pid {e.get('pid')})" + \
            (" - resumed after supervisor restart" if e.get("resumed") else "")
    if k == "attempt_start":
        r = e.get("resume")
        return f"attempt {a} started" + (f", resuming {r}" if r else ", from scratch")
    if k == "checkpoint":
        return f"checkpoint step {e.get('step')}"
    if k == "eval":
        return f"eval at step {e.get('step')}: acceptance length {e.get('accept_len')}"
    if k == "watchdog":
        return f"watchdog: {e.get('reason')}"
    if k == "throughput_low":
        return (f"throughput low ({e.get('cause')}): {e.get('summary')}; no restart, "
                f"config unchanged")
    if k == "throughput_ok":
        return f"throughput back: {e.get('reason')}"
    if k == "stacks":
        return f"stacks saved: {', '.join(e.get('files') or []) or 'none'}"
    if k == "attempt_end":
        how = f"signal {e.get('signal')}" if e.get("signal") else f"exit {e.get('exit_code')}"
        return f"attempt {a} ended: {how} after {e.get('duration_s', 0):.0f}s"
    if k == "classified":
        return f"attempt {a} classified {e.get('class')}: {e.get('reason')}"
    if k == "fallback":
        ch = ", ".join(f"{k2}={v}" for k2, v in (e.get("changed") or {}).items())
        return f"fallback for {e.get('class')}: {e.get('step') or 'same config'}" + \
            (f" ({ch})" if ch else "")
    if k == "restart":
        return f"restart as attempt {e.get('attempt')} in {e.get('delay_s', 0):.1f}s: {e.get('reason')}"
    if k == "give_up":
        return f"giving up on {e.get('class')}: {e.get('reason')}"
    if k == "run_first":
        return (f"ran first: {'; '.join(' '.join(c) for c in e.get('commands') or [])}"
                + ("" if e.get("ok") else f" (failed: {e.get('detail')})"))
    if k == "cache_restore":
        return f"compile cache: {e.get('detail')}"
    if k == "orphans_reaped":
        return f"reaped orphaned trainer processes {e.get('pids')}"
    if k == "stopping":
        return f"stopping: {e.get('reason')}"
    if str(k).startswith("standby_"):
        from .standby import describe
        return describe(e)
    if k == "final":
        return f"run {e.get('status')}: {e.get('reason')}"
    if k == "group_start":
        return (f"node {e.get('node')} ({e.get('host')}) of {len(e.get('nodes') or [])}, "
                f"coordinating through {e.get('head_addr')}:{e.get('coord_port')}")
    if k == "peer_abort":
        return f"attempt {a} stopped: {e.get('reason')}"
    if k == "node_end":
        return f"node {e.get('node')} ({e.get('host')}) attempt {a}: {e.get('class')}: " \
            f"{e.get('reason')}"
    if k == "node_lost":
        return str(e.get("reason") or f"node {e.get('host')} lost")
    if k == "group_decision":
        cause = e.get("cause") or {}
        what = ("restart" if e.get("action") == "restart"
                else f"final {e.get('status')}: {e.get('reason')}")
        return f"head's decision on attempt {a}: {what} (cause {cause.get('class')} on " \
            f"{cause.get('host')})"
    return str(k)
