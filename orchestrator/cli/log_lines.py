"""How ``dfo logs`` prints a followed run's lines (one host's, or each node's with a prefix)."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import click
from rich.markup import escape

from .console import console, progress_every, stamp

class JsonLinePrinter:
    """``dfo logs --json``: each line as one JSON object on stdout: ``file``
    (``events.jsonl`` or ``attempt-N.log``), ``offset`` (the byte just after it),
    ``attempt`` (an attempt log's number, else null), ``text`` (the line as it is) and, for
    an event, ``event`` (its record); ``host`` with --group."""

    def __init__(self, host: str | None = None):
        self.host = host

    def __call__(self, ln) -> None:
        obj: dict = {"file": ln.file, "offset": ln.offset, "attempt": ln.attempt,
                     "text": ln.text}
        if ln.event is not None:
            obj["event"] = json.loads(ln.text)
        if self.host is not None:
            obj = {"host": self.host, **obj}
        click.echo(json.dumps(obj))


def skipped_note(n: int, where: str = "") -> str:
    """The one line for lines of events.jsonl that were not events (and were not shown)."""
    what = "line" if n == 1 else "lines"
    return (f"dfo: {where}skipped {n} {what} of events.jsonl that {'is' if n == 1 else 'are'} "
            "not an event (garbage, invalid bytes or a torn write)")


def _event_style(e) -> str:
    from dfo_contract import events as ev

    if isinstance(e, ev.Final):
        return {"done": "bold green", "failed": "bold red"}.get(e.status, "bold yellow")
    return {
        ev.SupervisorStart: "dim", ev.AttemptStart: "bold blue", ev.Checkpoint: "green",
        ev.Watchdog: "magenta", ev.Stacks: "magenta", ev.AttemptEnd: "blue",
        ev.Classified: "bold red", ev.Fallback: "bold yellow", ev.Restart: "cyan",
        ev.GiveUp: "bold red", ev.OrphansReaped: "yellow", ev.Stopping: "yellow",
        ev.CacheRestore: "magenta",
    }.get(type(e), "default")


class LinePrinter:
    """Prints one followed line: events styled, @dfo markers summarised, known failure
    lines marked with their class (``raw``: the files' lines as they are)."""

    def __init__(self, raw: bool, prefix: str = ""):
        self.raw = raw
        self.prefix = prefix              # "host | " when following a group's nodes
        self.c = console()
        self.checkpoints: set = set()   # steps already shown (the event and the marker)
        self.quiet_since = time.monotonic()
        self._lock = threading.Lock()
        self._alive: str = ""           # the newest heartbeat, as "aN│ alive: PHASE step S"
        self._classified: set[str] = set()   # the long reasons already shown, once each

    def _out(self, s: str, markup: bool = True) -> None:
        with self._lock:
            if markup:
                self.c.print(escape(self.prefix) + s)
            else:
                self.c.print(self.prefix + s, markup=False)
            self.quiet_since = time.monotonic()

    @contextlib.contextmanager
    def beat(self, enabled: bool):
        """While following in a pipe: a line at least every ``DFO_PROGRESS_EVERY`` seconds
        (default 5) when the run prints none a person reads (compiling, warming up, a slow
        step): its newest heartbeat, else that the follower waits."""
        if not enabled or self.raw or self.c.is_terminal:
            yield self
            return
        stop = threading.Event()
        every = progress_every()

        def run() -> None:
            while not stop.wait(min(1.0, every)):
                if time.monotonic() - self.quiet_since >= every:
                    self._out(f"{stamp()} {self._alive or 'waiting for the run'}",
                              markup=False)

        t = threading.Thread(target=run, name="dfo-logs-beat", daemon=True)
        t.start()
        try:
            yield self
        finally:
            stop.set()
            t.join(timeout=2)

    def _checkpoint_once(self, attempt, step) -> bool:
        key = (str(attempt), str(step))
        if key in self.checkpoints:
            return False
        self.checkpoints.add(key)
        return True

    def _once(self, e) -> str:
        """``e`` described, a long classified reason shown once: the run's end (and its
        giving up) that repeat it say "the reason above" instead."""
        from dfo_contract.events import Classified, Final, GiveUp

        text = e.describe()
        if isinstance(e, Classified) and len(e.reason) >= 40:
            self._classified.add(e.reason)
        elif isinstance(e, (Final, GiveUp)):
            for r in self._classified:
                text = text.replace(r, "the reason above")
        return text

    def __call__(self, ln) -> None:
        text = getattr(ln, "text", "") or ""
        if not text.lstrip().startswith("@dfo"):
            self.quiet_since = time.monotonic()   # something a person reads was printed
        if self.raw:
            click.echo(self.prefix + ln.text)
            return
        from dfo_contract.events import Checkpoint

        from dfo_contract.trainer_markers import (CheckpointMarker, DoneMarker, HeartbeatMarker,
                                                  StepMarker, read_marker)

        from ..common.classify import match_line

        if ln.event is not None:
            e = ln.event
            if isinstance(e, Checkpoint) and not self._checkpoint_once(e.attempt, e.step):
                return
            ts = time.strftime("%H:%M:%S", time.localtime(e.t))
            self._out(f"[dim]{ts}[/] [{_event_style(e)}]▶ {escape(self._once(e))}[/]")
            for text in e.evidence_texts()[:6]:
                self._out(f"           [red]│ {escape(text)}[/]")
            return
        tag = f"[dim]a{ln.attempt}│[/] "
        m = read_marker(ln.text)
        if m is not None:
            # the trainer prints its own human line for each step; markers stay quiet
            if isinstance(m, CheckpointMarker):
                if self._checkpoint_once(ln.attempt, m.step):
                    self._out(f"{tag}[green]checkpoint step {m.step}[/]")
            elif isinstance(m, DoneMarker):
                self._out(f"{tag}[green]done at step {m.step}[/]")
            elif isinstance(m, HeartbeatMarker):
                # in a pipe, a quiet stretch (compiling, warm-up) still shows it is alive:
                # at this heartbeat when one is due, else from the beat (``beat``)
                self._alive = (f"a{ln.attempt}│ alive: {m.phase}"
                               + (f" step {m.step}" if m.step is not None else ""))
                if not self.c.is_terminal and \
                        time.monotonic() - self.quiet_since >= progress_every():
                    self._out(f"{stamp()} {self._alive}", markup=False)
                return
            elif isinstance(m, StepMarker) and m.loss_is_nan:
                self._out(f"{tag}[bold red]step {m.step} loss NaN[/]")
            return
        rule = match_line(ln.text, marker=m)
        if rule is not None:
            self._out(f"{tag}[bold red]{escape(ln.text)}[/]  [red]← {rule.cls}[/]")
        else:
            self._out(f"{tag}{escape(ln.text)}")
