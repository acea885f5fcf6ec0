"""Output for people and for pipes, in one place.

``console()`` is a rich Console for stdout (``console(stderr=True)`` for stderr). In a
terminal it is rich as usual, at the terminal's width. When the stream is not a terminal
(a pipe, a file, CI) it is wide (nothing is truncated to ``…``, no path breaks across lines)
and without colour codes.

``Activity`` is the progress of one long step (deploy stages, warm-cache, launch, demo): in a
terminal a rich spinner with the elapsed time, updated in place; otherwise plain
timestamped lines, one per change (at most one a second) and one every
``DFO_PROGRESS_EVERY`` seconds (default 5) while nothing changes, so a log of the command
shows it is alive at a steady pace; a step over within 2 seconds prints none.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Callable

import click
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from rich.live import Live
    from rich.status import Status

#: the width of a non-terminal console: wide enough that nothing is ever cut
PIPE_WIDTH = 4096


def console(stderr: bool = False, *, unlimited: bool = False) -> Console:
    """A rich Console for stdout/stderr: terminal-aware, never truncating in a pipe.
    ``unlimited``: in a terminal too, output at its natural width (the terminal wraps long
    lines; nothing is cut), for ``--wide``."""
    c = Console(stderr=stderr, highlight=False)
    if c.is_terminal:
        if unlimited:
            return Console(stderr=stderr, highlight=False, width=PIPE_WIDTH, soft_wrap=True,
                           force_terminal=True)
        return c
    return Console(stderr=stderr, highlight=False, width=PIPE_WIDTH, soft_wrap=True,
                   no_color=True, color_system=None)


def is_terminal(stderr: bool = False) -> bool:
    return Console(stderr=stderr).is_terminal


def progress_every() -> float:
    """Seconds between steady progress lines in a pipe (``DFO_PROGRESS_EVERY``, default 5)."""
    try:
        v = float(os.environ.get("DFO_PROGRESS_EVERY", "5"))
    except ValueError:
        return 5.0
    return v if v > 0 else 5.0


def stamp(clock: Callable[[], float] = time.time) -> str:
    return time.strftime("%H:%M:%S", time.localtime(clock()))


def note(message: str) -> None:
    """A ``dfo: ...`` note for people, on stderr (what engine calls ``say``)."""
    click.echo(f"dfo: {message}", err=True)


def print_launch(warnings, *, dry_run: bool, launched: str, title: str, rows) -> None:
    """A launch's answer: its warnings on stderr, then ``launched`` (one line) when it started,
    or for ``--dry-run`` the plan: ``title`` and its ``rows`` (lines, already escaped)."""
    err = console(stderr=True)
    for w in warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}")
    c = console()
    if not dry_run:
        c.print(launched)
        return
    c.print(title)
    for row in rows:
        c.print(row)


def minutes_seconds(seconds: float) -> str:
    """An elapsed time as ``4m07s``."""
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s"


class _Progress:
    """What :class:`Activity` and :class:`HostRows` share: the stderr console, plain lines
    (not a terminal: a steady beat from a thread) or a live display, and a quiet start."""

    def __init__(self, label: str, *, con: Console | None, enabled: bool, every: float | None):
        self.label = label
        self.con = con or console(stderr=True)
        self.enabled = enabled
        self.every = every if every is not None else progress_every()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()

    @property
    def plain(self) -> bool:
        return not self.con.is_terminal

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None

    def _start_beat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="dfo-progress", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        raise NotImplementedError

    def _quiet_over(self) -> bool:
        """A step that ends (or fails) within the first ``min(2, every)`` seconds prints no
        progress at all: its result (or its one-line error) is all a log needs."""
        return time.monotonic() - self._t0 >= min(2.0, self.every)


class Activity(_Progress):
    """Progress of one long step, on stderr. ``update(text)`` says what is happening now;
    ``line(text)`` prints a permanent line (a finished stage). Use as a context manager."""

    def __init__(self, label: str, *, con: Console | None = None, enabled: bool = True,
                 every: float | None = None):
        super().__init__(label, con=con, enabled=enabled, every=every)
        self.text = ""
        self._status: Status | None = None
        self._last = 0.0
        self._last_upd = 0.0

    def __enter__(self) -> "Activity":
        self._t0 = self._last = time.monotonic()
        if not self.enabled:
            return self
        if self.plain:
            self._start_beat()
        else:
            self._status = self.con.status(_Clocked(self))
            self._status.start()
        return self

    def close(self) -> None:
        super().close()
        if self._status is not None:
            self._status.stop()
            self._status = None

    def desc(self) -> str:
        """What the spinner says: ``LABEL (0m07s): TEXT``, the clock current at each refresh
        (before the text, so a narrow terminal that cuts the text keeps the clock)."""
        return f"{self.label} ({self._elapsed()})" + (f": {self.text}" if self.text else "")

    def _elapsed(self) -> str:
        return minutes_seconds(time.monotonic() - self._t0)

    def _plain(self, text: str) -> None:
        with self._lock:
            self.con.print(f"{stamp()} {text}", markup=False, highlight=False)
            self._last = time.monotonic()

    def update(self, text: str) -> None:
        changed = text != self.text
        self.text = text
        if not self.enabled:
            return
        if self._status is not None:
            self._status.update(_Clocked(self))
        elif self.plain and changed and self._quiet_over() and \
                time.monotonic() - self._last_upd >= min(1.0, self.every):
            self._last_upd = time.monotonic()
            # at most a line a second: a chatty step (uv's output) stays readable; the steady
            # beat shows the newest text
            self._plain(f"{self.label}: {text} ({self._elapsed()})")

    def line(self, markup_text: str) -> None:
        """A permanent line (rich markup), above the spinner in a terminal."""
        if not self.enabled:
            return
        if self.plain:
            from rich.text import Text

            self._plain(Text.from_markup(markup_text).plain)
        else:
            self.con.print(markup_text)

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.every)):
            if time.monotonic() - self._last >= self.every:
                self._plain(f"{self.label}: {self.text or 'working'} "
                            f"(still working, {self._elapsed()})")


class _Clocked:
    """An :class:`Activity`'s spinner text, rendered afresh at every refresh of the spinner
    (about 12 a second), so its clock runs while nothing else changes."""

    def __init__(self, act: Activity):
        self.act = act

    def __rich__(self):
        from rich.text import Text

        return Text(self.act.desc(), no_wrap=True, overflow="ellipsis")


class HostRows(_Progress):
    """Progress of one step on several hosts at once (``--group``), on stderr: in a terminal
    a live row per host (spinner, host, elapsed time, what it does now; a tick or a cross
    when it ends); otherwise plain timestamped lines ``HH:MM:SS LABEL: HOST: text``, at most
    one a second per host, a steady ``still working`` line per unfinished host every
    ``DFO_PROGRESS_EVERY`` seconds, and one line when a host ends (hosts that end within 2
    seconds print nothing: the summary says it). ``update``/``finish`` may be called from
    any thread."""

    def __init__(self, label: str, hosts, *, con: Console | None = None, enabled: bool = True,
                 every: float | None = None):
        super().__init__(label, con=con, enabled=enabled, every=every)
        self.hosts = list(hosts)
        self.text = {h: "waiting" for h in self.hosts}
        self.state = {h: "run" for h in self.hosts}   # run | ok | fail
        self.t_end: dict[str, float] = {}
        self._last = {h: 0.0 for h in self.hosts}     # last plain line per host
        self._live: Live | None = None
        self._spin: dict = {}

    def __enter__(self) -> "HostRows":
        self._t0 = time.monotonic()
        self._last = {h: self._t0 for h in self.hosts}
        if not self.enabled:
            return self
        if self.plain:
            self._start_beat()
        else:
            from rich.live import Live
            from rich.spinner import Spinner

            self._spin = {h: Spinner("dots") for h in self.hosts}
            self._live = Live(self, console=self.con, refresh_per_second=8, transient=False)
            self._live.start()
        return self

    def close(self) -> None:
        super().close()
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    def _elapsed(self, host: str) -> str:
        return minutes_seconds(self.t_end.get(host, time.monotonic()) - self._t0)

    def __rich__(self):
        from rich.markup import escape
        from rich.table import Table

        t = Table.grid(padding=(0, 1))
        t.add_column(width=1)
        t.add_column(no_wrap=True, style="bold")
        t.add_column(no_wrap=True, justify="right", style="dim")
        t.add_column(no_wrap=True, overflow="ellipsis")
        with self._lock:
            for h in self.hosts:
                st = self.state[h]
                icon = self._spin[h] if st == "run" else ("[green]✓[/]" if st == "ok" else "[red]✗[/]")
                t.add_row(icon, escape(h), self._elapsed(h), escape(self.text[h]))
        return t

    def _plain(self, host: str, text: str) -> None:
        self.con.print(f"{stamp()} {self.label}: {host}: {text}", markup=False, highlight=False)
        self._last[host] = time.monotonic()

    def update(self, host: str, text: str) -> None:
        if host not in self.text:
            return
        with self._lock:
            changed = text != self.text[host]
            self.text[host] = text
            if self.enabled and self.plain and changed and self._quiet_over() and \
                    time.monotonic() - self._last[host] >= min(1.0, self.every):
                self._plain(host, text)

    def finish(self, host: str, ok: bool, text: str) -> None:
        if host not in self.text:
            return
        with self._lock:
            self.state[host] = "ok" if ok else "fail"
            self.text[host] = text
            self.t_end[host] = time.monotonic()
            if self.enabled and self.plain and self._quiet_over():
                self._plain(host, f"{'done' if ok else 'FAILED'}: {text} ({self._elapsed(host)})")

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.every)):
            with self._lock:
                for h in self.hosts:
                    if self.state[h] == "run" and time.monotonic() - self._last[h] >= self.every:
                        self._plain(h, f"{self.text[h]} (still working, {self._elapsed(h)})")
