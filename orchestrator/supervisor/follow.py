"""Stream a run's files by byte offset: ``python -m orchestrator.supervisor.follow``.

Used by ``dfo logs`` over the transport. Each output line is one JSON object:

- ``{"f": "attempt-2.log", "o": 1234, "l": "text"}``: one complete line of file ``f``;
  ``o`` is the byte offset just after it. The caller restarts with ``--offsets`` set to
  the last ``o`` it received per file, so a dropped connection loses and repeats nothing.
- ``{"end": "done"|"failed"|"stopped"|"lost"}``: (with ``--follow``) the run ended and
  every file was read to its end.
- ``{"eof": true, "status": ...}``: (without ``--follow``) everything present was sent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..ops import runstate as rs
from . import procs
from .lines import read_lines
from .runfiles import read_state


def _emit(obj) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")


def _files(run_dir: str, only_attempt: int | None, from_attempt: int,
           events_first: bool = False) -> list[str]:
    names = [rs.EVENTS_FILE] if only_attempt is None else []
    logs = []
    try:
        listing = os.listdir(run_dir)
    except OSError:
        listing = []
    for nm in listing:
        n = rs.attempt_of_log(nm)
        if n is None:
            continue
        if (only_attempt is not None and n == only_attempt) or \
                (only_attempt is None and n >= from_attempt):
            logs.append((n, nm))
    # following: logs before events (an attempt's last lines come before the events about
    # its end); a one-off dump reads better with the story (events) first
    ordered = [nm for _, nm in sorted(logs)]
    return names + ordered if events_first else ordered + names


def _drain(run_dir: str, name: str, offsets: dict[str, int], final: bool) -> bool:
    off = offsets.get(name, 0)
    lines, offsets[name] = read_lines(os.path.join(run_dir, name), off, final=final)
    for ln in lines:
        _emit({"f": name, "o": ln.end, "l": ln.text})
    return bool(lines)


def _status(run_dir: str) -> tuple[str | None, int | None]:
    try:
        st = read_state(run_dir)
    except (OSError, ValueError):
        return None, None
    return st.status, st.pid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.supervisor.follow")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--offsets", default="{}")
    ap.add_argument("--follow", action="store_true")
    ap.add_argument("--attempt", type=int, default=None)
    ap.add_argument("--from-attempt", type=int, default=1)
    ap.add_argument("--poll", type=float, default=0.25)
    ap.add_argument("--lost-after", type=float, default=15.0)
    a = ap.parse_args(argv)
    if not os.path.isdir(a.run_dir):
        _emit({"error": f"no run directory {a.run_dir}"})
        return 2
    offsets = {str(k): int(v) for k, v in json.loads(a.offsets).items()}
    dead_since: float | None = None
    while True:
        status, pid = _status(a.run_dir)
        final = status in rs.FINAL
        lost = False
        if a.follow and not final and status is not None:
            if pid and not procs.alive(int(pid)):
                dead_since = dead_since or time.monotonic()
                lost = time.monotonic() - dead_since > a.lost_after
            else:
                dead_since = None
        for name in _files(a.run_dir, a.attempt, a.from_attempt, events_first=not a.follow):
            _drain(a.run_dir, name, offsets, final or lost or not a.follow)
        sys.stdout.flush()
        if not a.follow:
            _emit({"eof": True, "status": status})
            sys.stdout.flush()
            return 0
        if final or lost:
            _emit({"end": status if final else "lost"})
            sys.stdout.flush()
            return 0
        time.sleep(a.poll)


if __name__ == "__main__":
    sys.exit(main())
