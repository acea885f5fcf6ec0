"""Runs on a host, for ``dfo status`` and ``dfo stop``: ``python -m orchestrator.supervisor.query``.

``--root R [--run ID]`` prints ``{"runs": [...], "lock_owner": ...}``: each run's state.json
plus ``live`` (its supervisor process exists and is this run's) and ``shown_status``
(``lost`` when state.json says live but the supervisor is gone).
``--stop ID`` sends SIGTERM to that run's supervisor (after checking the pid is really it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from dfo_contract import runstate as rs
from dfo_contract.fsio import read_jsonl
from dfo_contract.procs import supervisor_alive

from . import procs
from .runfiles import read_notice, read_state_or_events


#: the processes that only read a run (a launch in progress or a supervisor is anything else)
_READERS = ("orchestrator.supervisor.follow", "orchestrator.supervisor.query")


def _newest_mtime(run_dir: str) -> float:
    newest = os.stat(run_dir).st_mtime
    for nm in os.listdir(run_dir):
        try:
            newest = max(newest, os.lstat(os.path.join(run_dir, nm)).st_mtime)
        except OSError:
            continue
    return newest


def _someone_works_on(run_dir: str) -> bool:
    """A process other than this one and the run's readers names ``run_dir`` in its argv
    (the supervisor, its setsid wrapper, launch's cache seeding) or has it as DFO_RUN_DIR."""
    me = os.getpid()
    mark = run_dir.rstrip("/")
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        argv = procs.cmdline(int(name))
        if any(r in argv for r in _READERS):
            continue
        if any(a == mark or a.startswith(mark + "/") for a in argv):
            return True
    return bool(procs.processes_of_run(run_dir, exclude=[me]))


def never_started(run_dir: str, quiet_s: float = 15.0, *, now: float | None = None) -> bool:
    """True for a run directory whose supervisor never started (its launch was cut off):
    no ``state.json``, nothing has changed in it for ``quiet_s`` seconds, and no process
    works on it. A launch still writing or seeding it is not caught by this."""
    if os.path.exists(os.path.join(run_dir, rs.STATE_FILE)):
        return False
    try:
        quiet = (time.time() if now is None else now) - _newest_mtime(run_dir) > quiet_s
    except OSError:
        return False
    return quiet and not _someone_works_on(run_dir)


def run_info(run_dir: str) -> dict | None:
    damage = None
    try:
        state, damage = read_state_or_events(run_dir)
        st = state.to_json()
    except (OSError, ValueError):
        if os.path.exists(os.path.join(run_dir, rs.SPEC_FILE)):
            rid = os.path.basename(run_dir)
            shown = "never_started" if never_started(run_dir) else "starting"
            return {"run_id": rid, "status": "starting", "shown_status": shown,
                    "live": False, "run_dir": run_dir, "attempts": [], "attempt": 0,
                    "started_at": os.path.getmtime(os.path.join(run_dir, rs.SPEC_FILE))}
        return None
    live = supervisor_alive(run_dir, st.get("pid"))
    st["live"] = live
    st["run_dir"] = run_dir
    shown = st.get("status")
    if shown in rs.LIVE and not live:
        note = read_notice(run_dir, st.get("pid"))
        if note is None:
            shown = "lost"
        else:   # its supervisor said how it ended where it could (the directory is read-only)
            shown = st["status"] = note[0].status
            st["reason"], st["ended_at"], st["notice"] = note[0].reason, note[0].t, note[1]
    st["shown_status"] = shown
    if damage:
        st["state_damaged"] = damage
    st["now"] = time.time()
    _add_metrics(st, run_dir)
    st["time"] = _time(run_dir, st["now"])
    st.pop("attempts_argv", None)
    for a in st.get("attempts", []):
        a.pop("argv", None)
    return st


def _add_metrics(st: dict, run_dir: str, tail_bytes: int = 16384) -> None:
    """``recent_tokens_per_s`` (for the sparkline) and ``last_step`` made current from the
    tail of metrics.jsonl and the newest checkpoint (state.json's step lags between logs)."""
    from ..ops.sparkline import current_step, metrics_tail

    try:
        records = read_jsonl(os.path.join(run_dir, "metrics.jsonl"), tail_bytes=tail_bytes).records
    except OSError:
        records = []
    step, tps = metrics_tail(records)
    ck = st.get("last_checkpoint") if isinstance(st.get("last_checkpoint"), dict) else {}
    if ck.get("path") and st.get("run_id"):
        # a later --new-lineage moves the run's checkpoints aside: say where they are now
        from dfo_contract.checkpoints import moved_checkpoint

        now_at = moved_checkpoint(str(ck["path"]), str(st["run_id"]))
        if now_at is not None and now_at != ck["path"]:
            ck = st["last_checkpoint"] = {**ck, "path": now_at}
    st["recent_tokens_per_s"] = tps
    st["last_step"] = current_step(st.get("last_step"), step, ck.get("step"))


def _time(run_dir: str, now: float) -> dict | None:
    """Goodput and the time lost per cause (ops.goodput), from the run's events; None when
    they cannot be read."""
    from dfo_contract.errors import ContractError
    from dfo_contract.events import read_events_file

    from ..ops.goodput import account

    try:
        return account(read_events_file(os.path.join(run_dir, rs.EVENTS_FILE)),
                       now=now).to_json()
    except (OSError, ValueError, ContractError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.supervisor.query")
    ap.add_argument("--root", required=True)
    ap.add_argument("--run", default=None)
    ap.add_argument("--stop", default=None)
    a = ap.parse_args(argv)
    runs_dir = os.path.join(a.root, "runs")
    if a.stop:
        rd = os.path.join(runs_dir, a.stop)
        info = run_info(rd)
        if info is None:
            print(json.dumps({"stopped": False, "why": "no such run"}))
            return 0
        if not info["live"]:
            print(json.dumps({"stopped": False, "why": f"not live ({info['shown_status']})",
                              "status": info["shown_status"]}))
            return 0
        os.kill(int(info["pid"]), signal.SIGTERM)
        print(json.dumps({"stopped": True, "pid": info["pid"]}))
        return 0
    names = [a.run] if a.run else (sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else [])
    runs = []
    for nm in names:
        info = run_info(os.path.join(runs_dir, nm))
        if info is not None:
            runs.append(info)
    lock = os.path.join(a.root, "locks", "run.lock")
    owner = None
    try:
        with open(lock) as f:
            owner = f.read(200).strip() or None
    except OSError:
        pass
    print(json.dumps({"runs": runs, "lock_owner": owner}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
