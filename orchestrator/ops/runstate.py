"""A run's files: ``state.json`` (schema + atomic write), ``events.jsonl`` records, spec.json.

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
import os
import re
import time
from typing import Any, Iterable, Mapping

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
    "watchdog",           # attempt, reason (hang / collapse / live pattern)
    "stacks",             # attempt, files
    "cache_restore",      # attempt, ok, detail
    "attempt_end",        # attempt, exit_code, signal, duration_s
    "classified",         # attempt, class, reason, evidence
    "fallback",           # attempt, class, step, changed, overrides
    "restart",            # next attempt, delay_s, reason
    "give_up",            # class, reason, evidence
    "orphans_reaped",     # pids
    "stopping",           # reason
    "final",              # status, reason
)

_ATTEMPT_LOG = re.compile(r"^attempt-(\d+)\.log$")


def attempt_log_name(n: int) -> str:
    return f"attempt-{n}.log"


def attempt_of_log(name: str) -> int | None:
    m = _ATTEMPT_LOG.match(name)
    return int(m.group(1)) if m else None


def _clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats become strings (state/events stay strict JSON)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(_clean(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def write_json_atomic(path: str, obj: Any) -> None:
    """Write JSON to ``path`` through a temporary name in the same dir, fsync, rename."""
    d = os.path.dirname(path) or "."
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    data = (json.dumps(_clean(obj), indent=1, sort_keys=True, allow_nan=False) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())


def event(kind: str, t: float | None = None, **fields: Any) -> dict:
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    rec = {"t": round(time.time() if t is None else t, 3), "kind": kind}
    rec.update(fields)
    return rec


def append_event(path: str, rec: Mapping[str, Any]) -> None:
    """Append one record as a single line with one write(2) on an O_APPEND fd, so a reader
    following by byte offset never sees half a record followed by another writer's bytes."""
    line = (dumps(rec) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


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


def new_state(run_id: str, run_name: str, *, now: float) -> dict:
    return {
        "version": STATE_VERSION,
        "run_id": run_id,
        "run_name": run_name,
        "status": "starting",
        "reason": None,
        "evidence": [],
        "pid": None,
        "mode": None,
        "started_at": now,
        "updated_at": now,
        "ended_at": None,
        "attempt": 0,
        "attempts": [],
        "overrides": {},          # config overrides in force (dotted keys)
        "fallbacks": [],          # [{"class", "step", "changed", "attempt"}] applied so far
        "ladder_pos": {},
        "budget": {},
        "last_step": None,
        "tokens_per_s": None,
        "baseline_tokens_per_s": None,
        "last_checkpoint": None,  # {"step", "path"}
        "trainer_pids": [],
        "last_event": None,
    }


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


def summarize_events(events: Iterable[Mapping[str, Any]]) -> str | None:
    last = None
    for e in events:
        last = e
    return describe_event(last) if last else None


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
    if k == "watchdog":
        return f"watchdog: {e.get('reason')}"
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
    if k == "cache_restore":
        return f"compile cache: {e.get('detail')}"
    if k == "orphans_reaped":
        return f"reaped orphaned trainer processes {e.get('pids')}"
    if k == "stopping":
        return f"stopping: {e.get('reason')}"
    if k == "final":
        return f"run {e.get('status')}: {e.get('reason')}"
    return str(k)
