"""Runs on a host, for ``dfo status`` and ``dfo stop``: ``python -m orchestrator.supervisor.query``.

``--root R [--run ID]`` prints a ``dfo_contract.status.QueryReply``: each run's state.json
plus ``live`` (its supervisor process exists and is this run's) and ``shown_status``
(``lost`` when state.json says live but the supervisor is gone).
``--stop ID`` sends SIGTERM to that run's supervisor (after checking the pid is really it)
and prints a ``StopReply``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time

from dfo_contract import runstate as rs
from dfo_contract.fsio import read_jsonl
from dfo_contract.goodput import Goodput
from dfo_contract.beat import read_beat
from dfo_contract.procs import proc_stat, supervisor_alive
from dfo_contract.runstate import RunState
from dfo_contract.status import (LOST, NEVER_STARTED, NOT_RESPONDING, QueryReply, RunStatus,
                                StopReply)

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


def run_info(run_dir: str) -> RunStatus | None:
    """The run in ``run_dir`` as ``dfo status`` shows it (None: not a run's directory)."""
    damage = None
    try:
        state, damage = read_state_or_events(run_dir)
    except (OSError, ValueError):
        spec = os.path.join(run_dir, rs.SPEC_FILE)
        if os.path.exists(spec):
            state = RunState(run_id=os.path.basename(run_dir),
                             started_at=os.path.getmtime(spec))
            shown = NEVER_STARTED if never_started(run_dir) else state.status
            return RunStatus(state=state, shown_status=shown, run_dir=run_dir)
        return None
    live = supervisor_alive(run_dir, state.pid)
    state = dataclasses.replace(state, extra={k: v for k, v in state.extra.items()
                                              if k != "attempts_argv"})
    shown, notice = state.status, None
    if shown in rs.LIVE and not live:
        note = read_notice(run_dir, state.pid)
        if note is None:
            shown = LOST
        else:   # its supervisor said how it ended where it could (the directory is read-only)
            shown, notice = note[0].status, note[1]
            state = dataclasses.replace(state, status=shown, reason=note[0].reason,
                                        ended_at=note[0].t)
    age, silent = None, None
    if live:
        age, silent = heartbeat(run_dir, state.pid)
        if silent is not None:
            shown = NOT_RESPONDING
    now = time.time()
    state, recent = _current_metrics(state, run_dir)
    return RunStatus(state=state, shown_status=shown, live=live, run_dir=run_dir,
                     state_damaged=damage or None, notice=notice, now=now,
                     recent_tokens_per_s=tuple(recent), time=_time(run_dir, now),
                     beat_age_s=age, not_responding=silent)


def heartbeat(run_dir: str, pid: int | None) -> tuple[float | None, str | None]:
    """The age of the live supervisor's heartbeat (dfo_contract.beat), and the line saying
    it is not responding when that age is past its ``silent_s`` (else None)."""
    beat = read_beat(run_dir, pid)
    if beat is None:
        return None, None
    age = round(beat.age(time.monotonic()), 1)
    if age <= beat.silent_s:
        return age, None
    st = proc_stat(beat.pid)
    why = (f"its process is stopped (state {st.state}: SIGSTOP, Ctrl-Z or a debugger); "
           f"`kill -CONT {beat.pid}` resumes it" if st is not None and st.stopped else
           f"its process is in state {st.state if st else '?'}; look at it with "
           f"`cat /proc/{beat.pid}/stack` or py-spy, or `dfo stop` it")
    return age, (f"the supervisor (pid {beat.pid}) is not responding: no heartbeat for "
                 f"{age:.0f}s (limit {beat.silent_s:.0f}s); {why}")


def _current_metrics(state: RunState, run_dir: str,
                     tail_bytes: int = 16384) -> tuple[RunState, list[float]]:
    """``state`` with its ``last_step`` made current from the tail of metrics.jsonl and the
    newest checkpoint (state.json's step lags between logs) and its ``last_checkpoint``
    where it lies now; and the tail's recent tokens/s (for the sparkline)."""
    from dfo_contract.metrics_record import METRICS_FILE, metrics_records

    from ..common.sparkline import current_step, metrics_tail

    try:
        records = metrics_records(read_jsonl(os.path.join(run_dir, METRICS_FILE),
                                             tail_bytes=tail_bytes).records)
    except OSError:
        records = []
    step, tps = metrics_tail(records)
    ck = state.last_checkpoint
    if ck is not None and ck.path and state.run_id:
        # a later --new-lineage moves the run's checkpoints aside: say where they are now
        from dfo_contract.checkpoints import moved_checkpoint

        now_at = moved_checkpoint(str(ck.path), str(state.run_id))
        if now_at is not None and now_at != ck.path:
            ck = dataclasses.replace(ck, path=now_at)
    return dataclasses.replace(state, last_checkpoint=ck,
                               last_step=current_step(state.last_step, step,
                                                      ck.step if ck else None)), tps


def _time(run_dir: str, now: float) -> Goodput | None:
    """Goodput and the time lost per cause (common.goodput), from the run's events; None when
    they cannot be read."""
    from dfo_contract.errors import ContractError
    from dfo_contract.events import read_events_file

    from ..common.goodput import account

    try:
        return account(read_events_file(os.path.join(run_dir, rs.EVENTS_FILE)), now=now,
                       mono=time.monotonic())
    except (OSError, ValueError, ContractError):
        return None


def stop(run_dir: str) -> StopReply:
    """SIGTERM to the supervisor of the run in ``run_dir`` when it is live."""
    info = run_info(run_dir)
    if info is None:
        return StopReply(stopped=False, why="no such run")
    pid = info.state.pid
    if not info.live or pid is None:
        return StopReply(stopped=False, why=f"not live ({info.shown_status})",
                         status=info.shown_status)
    os.kill(pid, signal.SIGTERM)
    return StopReply(stopped=True, pid=pid)


def query(root: str, run: str | None = None) -> QueryReply:
    """The runs under ``root`` (only ``run`` when given) and run.lock's owner."""
    runs_dir = os.path.join(root, "runs")
    names = [run] if run else (sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else [])
    runs = [info for nm in names if (info := run_info(os.path.join(runs_dir, nm))) is not None]
    owner = None
    try:
        with open(os.path.join(root, "locks", "run.lock")) as f:
            owner = f.read(200).strip() or None
    except OSError:
        pass
    return QueryReply(runs=tuple(runs), lock_owner=owner)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.supervisor.query")
    ap.add_argument("--root", required=True)
    ap.add_argument("--run", default=None)
    ap.add_argument("--stop", default=None)
    a = ap.parse_args(argv)
    reply: QueryReply | StopReply
    if a.stop:
        reply = stop(os.path.join(a.root, "runs", a.stop))
    else:
        reply = query(a.root, a.run)
    print(json.dumps(reply.to_json(), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
