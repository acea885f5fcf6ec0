"""Follow a run's events and attempt logs by byte offset, reconnecting after SSH drops.

The far side is ``python -m orchestrator.supervisor.follow``: it sends each complete line
with the byte offset just after it. This side remembers, per file, the offset of the last
line it handed on, and after a dropped connection restarts the follower from exactly
there: no line is lost, none is repeated (no ``tail -F`` guessing). Ctrl-C only stops this
side; the run is never touched.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from dfo_contract import events, runstate as rs, wire
from dfo_contract.errors import ContractError, VersionError

from ..common.errors import (ConnectError, ContractMismatch, DfoError, HostKeyError, NotFoundError,
                      RemoteCommandError, RunFailed)
from ..transport.base import env_error

log = logging.getLogger("dfo")


@dataclass(frozen=True)
class LogLine:
    file: str                  # "events.jsonl" or "attempt-N.log"
    offset: int                # byte offset just after this line
    text: str
    attempt: int | None        # for attempt logs
    event: events.Event | None   # the decoded record, for events.jsonl


class LogFollower:
    def __init__(self, transport, tree, run_id: str, *, on_line: Callable[[LogLine], None],
                 follow: bool = False, attempt: int | None = None, from_attempt: int = 1,
                 since: float | None = None, max_retries: int = 20,
                 on_reconnect: Callable[[int, str], None] | None = None,
                 on_skipped: Callable[[int], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep, poll: float = 0.25):
        self.transport = transport
        self.tree = tree
        self.run_id = run_id
        self.on_line = on_line
        self.follow = follow
        self.attempt = attempt
        self.from_attempt = from_attempt
        self.since = since
        self.max_retries = max_retries
        self.on_reconnect = on_reconnect or (lambda n, why: None)
        #: told once, when following ends, how many lines of events.jsonl were not events
        self.on_skipped = on_skipped or (lambda n: None)
        self.skipped = 0
        self.sleep = sleep
        self.poll = poll
        self.offsets: dict[str, int] = {}
        self.reconnects = 0

    def argv(self) -> list[str]:
        a = [self.tree.current_python, "-m", "orchestrator.supervisor.follow",
             "--run-dir", self.tree.run_dir(self.run_id),
             "--offsets", wire.encode_offsets(self.offsets),
             "--from-attempt", str(self.from_attempt), "--poll", str(self.poll)]
        if self.attempt is not None:
            a += ["--attempt", str(self.attempt)]
        if self.follow:
            a.append("--follow")
        return a

    def run(self) -> str | None:
        """Stream until the run ends (``-f``: returns its final status) or everything present
        was shown (returns the status then). Lines of events.jsonl that are not events
        (garbage, invalid bytes, a torn write) are never shown; their count goes to
        ``on_skipped`` at the end."""
        try:
            return self._run()
        finally:
            if self.skipped:
                self.on_skipped(self.skipped)

    def _run(self) -> str | None:
        failures = 0
        while True:
            box: dict[type, Any] = {}   # the follower's last End / Eof / Error
            progressed = [False]
            stray: list[str] = []   # lines that are not the follower's (e.g. a traceback)

            # handle() reads this round's box/progressed/stray (B023: the stream ends in it)
            def handle(raw: str) -> None:
                try:
                    rec = wire.decode(raw)
                except VersionError as e:
                    raise ContractMismatch(f"run {self.run_id}: {e}") from None
                if rec is None:
                    stray[:] = (stray + [raw])[-20:]  # noqa: B023
                    return  # a torn line from a dropped connection, or stray stderr
                if isinstance(rec, wire.Line):
                    if rec.offset <= self.offsets.get(rec.file, 0) and not rec.restart:
                        return  # never repeat a line (but a file that shrank starts over)
                    self.offsets[rec.file] = rec.offset
                    progressed[0] = True  # noqa: B023
                    self._deliver(rec.file, rec.offset, rec.text)
                elif isinstance(rec, (wire.End, wire.Eof, wire.Error)):
                    box[type(rec)] = rec  # noqa: B023

            why = ""
            argv = self.argv()
            try:
                res = self.transport.stream(argv, handle)
                env = env_error(argv, res.exit_code, "\n".join(stray))
                if env is not None:   # the env lacks dfo: no reconnect can help
                    raise env
                why = f"follower exited {res.exit_code}"
            except HostKeyError:
                raise   # a changed host key is not a dropped connection: stop at once
            except ConnectError as e:
                why = e.message    # what happened; its hint (run it again) is not for a retry
            except RemoteCommandError as e:
                why = e.message
            if wire.Error in box:
                raise NotFoundError(f"run {self.run_id}: {box[wire.Error].message}",
                                    hint="see `dfo status` for run ids")
            end, eof = box.get(wire.End), box.get(wire.Eof)
            if end is not None and end.status == wire.NEVER_STARTED:
                rd = self.tree.run_dir(self.run_id)
                raise RunFailed(f"run {self.run_id} never started: its launch was cut off before "
                                "the supervisor started (no state.json, nothing runs)",
                                hint=f"remove {rd} (nothing of it ran) and `dfo launch` again")
            if end is not None:
                return end.status
            if eof is not None:
                return eof.status
            failures = 0 if progressed[0] else failures + 1
            if failures > self.max_retries:
                raise ConnectError(f"lost the connection to {self.transport.name} and could not "
                                   f"resume following ({why})",
                                   hint="run `dfo logs -f` again; the run is unaffected")
            self.reconnects += 1
            self.on_reconnect(self.reconnects, why)
            self.sleep(min(5.0, 0.5 * (2 ** min(failures, 4))))

    def _deliver(self, name: str, off: int, text: str) -> None:
        ev = None
        att = None
        if name == rs.EVENTS_FILE:
            try:
                ev = events.decode(text)
            except events.NotARecord:
                self.skipped += 1    # not an event: counted, never shown as one
                return
            except ContractError as e:
                raise ContractMismatch(f"run {self.run_id}: {rs.EVENTS_FILE}: {e}") from None
            if self.since is not None and ev is not None and ev.t < self.since:
                return
        else:
            att = rs.attempt_of_log(name)
        self.on_line(LogLine(name, off, text, att, ev))


def current_attempt(run_ops, run_id: str) -> int:
    try:
        runs = run_ops.status(run_id)
    except DfoError:
        return 1
    return int(runs[0].state.attempt or 1) if runs else 1
