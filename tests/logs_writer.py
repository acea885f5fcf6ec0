"""A stand-in *writer* for log-follow tests: appends lines to a run dir's events.jsonl and
attempt logs the way the supervisor and the trainer do (including lines written in two
pieces), moves on to a second attempt, then marks state.json final. state.json names it as
the run's supervisor, and its command line says so too (it re-executes itself with
``orchestrator.supervisor`` added), so followers take it for a live one while it writes.

    python tests/logs_writer.py RUN_DIR N_LINES DELAY_S [HOLD_FILE]

With HOLD_FILE, the second attempt goes on writing lines after its N until HOLD_FILE exists
(at most 120 s), so a follower always has more to read until the test lets the run end.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dfo_contract import events  # noqa: E402
from dfo_contract.procs import SUPERVISOR_MODULE  # noqa: E402
from dfo_contract import runstate as rs  # noqa: E402
from orchestrator.supervisor import runfiles  # noqa: E402


def _lines(n: int, hold: str | None):
    """0..n-1, then on (a line each time it is asked) until ``hold`` exists (at most 120 s)."""
    yield from range(n)
    end, i = time.monotonic() + 120, n
    while hold is not None and not os.path.exists(hold) and time.monotonic() < end:
        yield i
        i += 1


def main() -> None:
    if SUPERVISOR_MODULE not in sys.argv:   # same pid, the supervisor's words in its argv
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:],
                                  SUPERVISOR_MODULE])
    args = [a for a in sys.argv[1:] if a != SUPERVISOR_MODULE]
    run_dir, n, delay = args[0], int(args[1]), float(args[2])
    hold = args[3] if len(args) > 3 else None
    st = rs.new_state("w", "w", now=time.time())
    st.update(status="running", pid=os.getpid(), attempt=1)
    runfiles.write_json_atomic(os.path.join(run_dir, rs.STATE_FILE), st)
    for att in (1, 2):
        runfiles.append_event(os.path.join(run_dir, rs.EVENTS_FILE),
                              events.AttemptStart(attempt=att, resume=None, overrides={},
                                                  argv=["trainer"], pid=os.getpid(),
                                                  log=rs.attempt_log_name(att)))
        path = os.path.join(run_dir, rs.attempt_log_name(att))
        with open(path, "ab", buffering=0) as f:
            for i in _lines(n, hold if att == 2 else None):
                line = f"attempt {att} line {i} " + "x" * (i % 37) + (" ünïcödé" if i % 11 == 0 else "")
                data = (line + "\n").encode()
                if i % 7 == 3:  # a line written in two pieces
                    f.write(data[:5])
                    time.sleep(delay)
                    f.write(data[5:])
                else:
                    f.write(data)
                if i % 5 == 0:
                    f.write(b"\n")  # empty lines are lines too
                time.sleep(delay)
        st["attempt"] = 2
        runfiles.write_json_atomic(os.path.join(run_dir, rs.STATE_FILE), st)
    runfiles.append_event(os.path.join(run_dir, rs.EVENTS_FILE),
                          events.Final(status="done", reason="writer finished",
                                       last_checkpoint=None))
    st["status"] = "done"
    runfiles.write_json_atomic(os.path.join(run_dir, rs.STATE_FILE), st)
    print(json.dumps({"ok": True}))


if __name__ == "__main__":
    main()
