"""Follow a run's events and attempt logs by byte offset, reconnecting after SSH drops.

The far side is ``python -m orchestrator.supervisor.follow``: it sends each complete line
with the byte offset just after it. This side remembers, per file, the offset of the last
line it handed on, and after a dropped connection restarts the follower from exactly
there: no line is lost, none is repeated (no ``tail -F`` guessing). Ctrl-C only stops this
side; the run is never touched.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from dfo_contract.fsio import json_object

from ..errors import (ConnectError, DfoError, HostKeyError, NotFoundError, RemoteCommandError,
                      RunFailed)
from ..ops import runstate as rs
from ..transport.base import env_error

#: what the far side's follower sends for a run whose supervisor never started
NEVER_STARTED = "never_started"

log = logging.getLogger("dfo")


@dataclass(frozen=True)
class LogLine:
    file: str                  # "events.jsonl" or "attempt-N.log"
    offset: int                # byte offset just after this line
    text: str
    attempt: int | None        # for attempt logs
    event: dict | None         # parsed record for events.jsonl


class LogFollower:
    def __init__(self, transport, layout, run_id: str, *, on_line: Callable[[LogLine], None],
                 follow: bool = False, attempt: int | None = None, from_attempt: int = 1,
                 since: float | None = None, max_retries: int = 20,
                 on_reconnect: Callable[[int, str], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep, poll: float = 0.25):
        self.t = transport
        self.layout = layout
        self.run_id = run_id
        self.on_line = on_line
        self.follow = follow
        self.attempt = attempt
        self.from_attempt = from_attempt
        self.since = since
        self.max_retries = max_retries
        self.on_reconnect = on_reconnect or (lambda n, why: None)
        self.sleep = sleep
        self.poll = poll
        self.offsets: dict[str, int] = {}
        self.reconnects = 0

    def argv(self) -> list[str]:
        a = [self.layout.current_python, "-m", "orchestrator.supervisor.follow",
             "--run-dir", self.layout.run_dir(self.run_id),
             "--offsets", json.dumps(self.offsets, sort_keys=True),
             "--from-attempt", str(self.from_attempt), "--poll", str(self.poll)]
        if self.attempt is not None:
            a += ["--attempt", str(self.attempt)]
        if self.follow:
            a.append("--follow")
        return a

    def run(self) -> str | None:
        """Stream until the run ends (``-f``: returns its final status) or everything present
        was shown (returns the status then)."""
        failures = 0
        while True:
            box: dict[str, Any] = {}
            progressed = [False]
            stray: list[str] = []   # lines that are not the follower's (e.g. a traceback)

            def handle(raw: str) -> None:
                rec = json_object(raw)
                if rec is None:
                    stray[:] = (stray + [raw])[-20:]
                    return  # a torn line from a dropped connection, or stray stderr
                if "f" in rec:
                    try:
                        name, off = str(rec["f"]), int(rec["o"])
                    except (KeyError, TypeError, ValueError):
                        return  # not one of the follower's records
                    if off <= self.offsets.get(name, 0):
                        return  # never repeat a line
                    self.offsets[name] = off
                    progressed[0] = True
                    self._deliver(name, off, str(rec.get("l", "")))
                elif "end" in rec:
                    box["end"] = rec["end"]
                elif "eof" in rec:
                    box["eof"] = rec.get("status")
                elif "error" in rec:
                    box["error"] = rec["error"]

            why = ""
            argv = self.argv()
            try:
                res = self.t.stream(argv, handle)
                env = env_error(argv, res.exit_code, "\n".join(stray))
                if env is not None:   # the env lacks dfo: no reconnect can help
                    raise env
                why = f"follower exited {res.exit_code}"
            except HostKeyError:
                raise   # a changed host key is not a dropped connection: stop at once
            except ConnectError as e:
                why = str(e)
            except RemoteCommandError as e:
                why = str(e)
            if "error" in box:
                raise NotFoundError(f"run {self.run_id}: {box['error']}",
                                    hint="see `dfo status` for run ids")
            if box.get("end") == NEVER_STARTED:
                rd = self.layout.run_dir(self.run_id)
                raise RunFailed(f"run {self.run_id} never started: its launch was cut off before "
                                "the supervisor started (no state.json, nothing runs)",
                                hint=f"remove {rd} (nothing of it ran) and `dfo launch` again")
            if "end" in box:
                return box["end"]
            if "eof" in box:
                return box["eof"]
            failures = 0 if progressed[0] else failures + 1
            if failures > self.max_retries:
                raise ConnectError(f"lost the connection to {self.t.name} and could not "
                                   f"resume following ({why})",
                                   hint="run `dfo logs -f` again; the run is unaffected")
            self.reconnects += 1
            self.on_reconnect(self.reconnects, why)
            self.sleep(min(5.0, 0.5 * (2 ** min(failures, 4))))

    def _deliver(self, name: str, off: int, text: str) -> None:
        ev = None
        att = None
        if name == rs.EVENTS_FILE:
            ev = json_object(text)
            if self.since is not None and isinstance(ev, dict) and \
                    float(ev.get("t") or 0) < self.since:
                return
        else:
            att = rs.attempt_of_log(name)
        self.on_line(LogLine(name, off, text, att, ev))


def current_attempt(ops, run_id: str) -> int:
    try:
        runs = ops.status(run_id)
    except DfoError:
        return 1
    return int(runs[0].get("attempt") or 1) if runs else 1
