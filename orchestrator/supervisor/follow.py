"""Stream a run's files by byte offset: ``python -m orchestrator.supervisor.follow``.

Used by ``dfo logs`` over the transport. Each output line is one record of
``dfo_contract.wire``:

- ``Line``: one complete line of a file and the byte offset just after it. The caller
  restarts with ``--offsets`` set to the last offset it received per file, so a dropped
  connection loses and repeats nothing.
- ``End``: (with ``--follow``) the run ended (done, failed, stopped, lost) and every file
  was read to its end; ``never_started``: the run directory has no ``state.json``, nothing
  changed in it for ``--lost-after`` seconds and no process works on it (its launch was
  cut off before the supervisor started).
- ``Eof``: (without ``--follow``) everything present was sent.
- ``Keepalive``: following, every ``KEEPALIVE_S`` while nothing else is sent.
- ``Error``: no such run directory, or (following) it was deleted.

It never outlives its client: it exits when a write to stdout fails (the pipe closed: the
SSH channel or ``pct exec`` is gone) or when its parent changes (the parent died).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from dfo_contract import runstate as rs
from dfo_contract import wire
from dfo_contract.procs import supervisor_alive

from .lines import read_lines
from .query import never_started
from .runfiles import read_notice, read_state_or_events

#: seconds between keepalives while nothing else is sent (a closed pipe shows on a write)
KEEPALIVE_S = 2.0


class ClientGone(Exception):
    """stdout is closed or the parent process died: nobody reads what this sends."""


def _send(rec: wire.Record) -> None:
    try:
        sys.stdout.write(wire.encode(rec) + "\n")
    except (BrokenPipeError, ValueError, OSError):
        raise ClientGone() from None


def _flush() -> None:
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, OSError):
        raise ClientGone() from None


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


#: an attempt log's line longer than this is cut (a trainer may print megabytes in one line)
MAX_LINE_CHARS = 4000


def _drain(run_dir: str, name: str, offsets: dict[str, int], final: bool,
           restarted: set[str]) -> bool:
    """Send the complete lines of ``name`` after its offset. A file shorter than its offset
    (emptied or rewritten) is read again from its start; its next line says so (``restart``).
    Attempt logs: a lone ``\r`` ends a line and a line is cut at ``MAX_LINE_CHARS``."""
    path = os.path.join(run_dir, name)
    off = offsets.get(name, 0)
    try:
        if os.path.getsize(path) < off:
            off = offsets[name] = 0
            restarted.add(name)
    except OSError:
        pass
    log = name != rs.EVENTS_FILE
    lines, offsets[name] = read_lines(path, off, final=final, cr=log,
                                      max_chars=MAX_LINE_CHARS if log else None)
    for i, ln in enumerate(lines):
        _send(wire.Line(name, ln.end, ln.text, restart=i == 0 and name in restarted))
    if lines:
        restarted.discard(name)
    return bool(lines)


def _status(run_dir: str) -> tuple[str | None, int | None]:
    try:
        st, _ = read_state_or_events(run_dir)   # a damaged state.json: what the events say
    except (OSError, ValueError):
        return None, None
    return st.status, st.pid


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except ClientGone:
        try:  # stdout is a dead pipe: keep the interpreter's final flush from failing on it
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 0


def _main(argv: list[str] | None = None) -> int:
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
        _send(wire.Error(f"no run directory {a.run_dir}"))
        return 2
    offsets = wire.decode_offsets(a.offsets)
    dead_since: float | None = None
    parent = os.getppid()
    last_sent = time.monotonic()
    restarted: set[str] = set()
    first_look: bool | None = None
    while True:
        if a.follow and os.getppid() != parent:
            raise ClientGone()   # the process that reads us died
        if not os.path.isdir(a.run_dir):
            _send(wire.Error(f"its run directory {a.run_dir} was deleted"))
            _flush()
            return 2
        status, pid = _status(a.run_dir)
        if a.follow and status is None and never_started(a.run_dir, a.lost_after):
            _send(wire.End(wire.NEVER_STARTED))
            _flush()
            return 0
        gone = status in rs.LIVE and bool(pid) and not supervisor_alive(a.run_dir, pid)
        note = read_notice(a.run_dir, pid) if gone else None
        if note is not None:   # it ended where state.json could not say (read-only)
            status = note[0].status
        final = status in rs.FINAL
        lost = False
        if a.follow and not final and status is not None:
            if gone:
                dead_since = dead_since or time.monotonic()
                lost = time.monotonic() - dead_since > a.lost_after
            else:
                dead_since = None
        # a run that had ended before the first look reads as without --follow: the story
        # (events) first, then the attempt logs
        if first_look is None:
            first_look = final
        sent = False
        for name in _files(a.run_dir, a.attempt, a.from_attempt,
                           events_first=not a.follow or first_look):
            sent = _drain(a.run_dir, name, offsets, final or lost or not a.follow,
                          restarted) or sent
        if not a.follow:
            _send(wire.Eof(status))
            _flush()
            return 0
        if final or lost:
            _send(wire.End(status if final and status else wire.LOST))
            _flush()
            return 0
        now = time.monotonic()
        if sent:
            last_sent = now
        elif now - last_sent >= KEEPALIVE_S:
            _send(wire.Keepalive())
            last_sent = now
        _flush()
        time.sleep(a.poll)


if __name__ == "__main__":
    sys.exit(main())
