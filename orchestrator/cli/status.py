"""``dfo status`` (table, ``--wide``, ``--json``, ``--watch``) and ``dfo stop``: click only."""

from __future__ import annotations

import json
import math
import time

import click
from rich import box
from rich.table import Table
from rich.text import Text

from dfo_contract import runstate as rs
from dfo_contract.status import LOST, RunStatus

from ..common.sparkline import sparkline
from .console import console, minutes_seconds, stamp
from .group_run import GROUP_OPTION, group_status, group_stop
from .params import POSITIVE_SECONDS
from .run_ops import open_run_ops, require_run

#: every column, in display order
COLUMNS = ("run", "state", "step", "tok/s", "trend", "accept", "goodput", "fallback", "attempt",
           "checkpoint", "last event", "uptime")
#: what a narrow terminal keeps: these always, then the optional ones in this order while
#: they fit (--wide: all, folded to fit)
REQUIRED = ("run", "state", "step", "tok/s", "fallback")
OPTIONAL = ("trend", "accept", "checkpoint", "goodput", "attempt", "uptime", "last event")
_STYLE = {"done": "green", "failed": "red", "lost": "red", "not_responding": "red",
          "running": "cyan",
          "backoff": "yellow", "stopping": "yellow", "stopped": "dim"}


def columns_for(width: int | None, wide: bool = False,
                cells: list[dict[str, str]] | None = None) -> list[str]:
    """The columns ``dfo status`` shows at a terminal ``width`` (None or --wide: all):
    the required ones, then each optional one that holds a value (not only ``-``) and
    still fits its widest cell."""
    if wide or width is None:
        return list(COLUMNS)

    def need(c: str) -> int:
        lines = [ln for row in cells or [] for ln in row.get(c, "").split("\n")]
        return max([len(c), *map(len, lines)]) + 3    # + padding and divider

    used = sum(need(c) for c in REQUIRED) - 3   # no outer edge or edge padding
    chosen = set(REQUIRED)
    for c in OPTIONAL:
        if all(row.get(c, "-") == "-" for row in cells or [{}]):
            continue
        if used + need(c) <= width:
            chosen.add(c)
            used += need(c)
    return [c for c in COLUMNS if c in chosen]


def _finite(x) -> float | None:
    """A number read from a state file, or None when it is missing or not a finite number
    (a hand-edited or damaged state.json must not end ``dfo status`` in a traceback)."""
    if isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _age(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else minutes_seconds(s)


def _accept(r: RunStatus) -> str:
    """The measured acceptance length (eval markers): ``3.91`` or ``3.91 (best 4.13)``."""
    a, b = _finite(r.state.accept_len), _finite(r.state.best_accept_len)
    if a is None:
        return "-"
    return f"{a:.2f}" if b is None or abs(b - a) < 5e-3 else f"{a:.2f} (best {b:.2f})"


def _goodput(r: RunStatus) -> str:
    """The share of the run's time spent training (common.goodput), ``87%``; ``-`` unknown."""
    g = None if r.time is None else _finite(r.time.goodput)
    return "-" if g is None else f"{g * 100:.0f}%"


def row_values(r: RunStatus, sep: str = ", ") -> dict[str, Text]:
    """One run's cells, all as Text (values from state.json are text, never markup)."""
    s = r.state
    st = r.shown_status or "?"
    fb = sep.join(str(f.step) for f in s.fallbacks) or "-"
    ck = s.last_checkpoint
    end = _finite(s.ended_at) or _finite(r.now) or time.time()
    tps = _finite(s.tokens_per_s)
    started = _finite(s.started_at)
    return {
        "run": Text(str(r.run_id)),
        "state": Text(st if not r.not_responding or r.beat_age_s is None else
                      f"{st} ({_age(r.beat_age_s)})", style=_STYLE.get(st, "")),
        "step": Text(str(s.last_step if s.last_step is not None else "-")),
        "tok/s": Text("-" if tps is None else f"{tps:.0f}"),
        "trend": Text(sparkline(list(r.recent_tokens_per_s), 8) or "-", style="cyan"),
        "accept": Text(_accept(r)), "goodput": Text(_goodput(r)),
        "fallback": Text(fb), "attempt": Text(str(s.attempt or 0)),
        "checkpoint": Text(f"step_{ck.step}" if ck and ck.step is not None else "-"),
        "last event": Text(str(s.last_event or "-")),
        "uptime": Text("-" if started is None else _age(end - started)),
    }


def status_table(host: str, runs: list[RunStatus], *, width: int | None = None,
                 wide: bool = False) -> Table:
    """The rich table of ``dfo status``: at ``width`` the columns that fit (run id, state,
    step, tok/s and fallback always; fallback folds rather than cut)."""
    narrow = not wide and width is not None
    rows = [row_values(r, "\n" if narrow else ", ") for r in runs]
    cols = columns_for(width, wide, [{c: v.plain for c, v in row.items()} for row in rows])
    t = (Table(title=Text(f"runs on {host}"), box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
         if narrow else Table(title=Text(f"runs on {host}"), box=box.HEAVY_HEAD))
    for c in cols:
        if c == "fallback" or c == "last event":
            # one fallback a line in a terminal: each stays whole (fold only what cannot fit)
            longest = max((len(x) for v in rows for x in v[c].plain.split("\n")), default=1)
            t.add_column(c, overflow="fold", min_width=min(longest, 20) if narrow else None)
        elif c == "run":   # whole on one line when it fits; a very long id folds, never cut
            t.add_column(c, overflow="fold")
        else:
            t.add_column(c, no_wrap=True,
                         justify="right" if c in ("step", "tok/s", "attempt", "goodput") else "left")
    for v in rows:
        t.add_row(*(v[c] for c in cols))
    return t


def _change_line(r: RunStatus) -> str:
    v = row_values(r)
    return " ".join(f"{c}={v[c].plain}" for c in ("run", "state", "attempt", "step", "tok/s", "accept", "fallback",
                                                  "checkpoint"))


def _final(r: RunStatus) -> bool:
    return r.shown_status in rs.FINAL + (LOST,)


def watch(run_ops, run_id: str, *, interval: float, wide: bool) -> int:
    """Refresh the run's row in place (rich Live) until it ends; not a terminal: one line per
    change. Returns 0 (Ctrl-C: 130, the run goes on)."""
    con = console()
    host = run_ops.host.name
    if not con.is_terminal:
        last = None
        while True:
            runs = run_ops.status(run_id)
            require_run(run_ops, run_id, runs)
            line = _change_line(runs[0])
            if line != last:
                con.print(f"{stamp()} {line}", markup=False)
                last = line
            if _final(runs[0]):
                return 0
            time.sleep(interval)
    from rich.live import Live

    runs = run_ops.status(run_id)
    require_run(run_ops, run_id, runs)
    with Live(status_table(host, runs, width=con.width, wide=wide), console=con,
              auto_refresh=False) as live:
        while not _final(runs[0]):
            time.sleep(interval)
            runs = run_ops.status(run_id) or runs
            live.update(status_table(host, runs, width=con.width, wide=wide), refresh=True)
    return 0


@click.command()
@click.option("--host", "host_name", default=None, metavar="NAME", help="Host from hosts.yaml (default: the default host).")
@click.option("--run", "run_id", default=None, metavar="ID", help="Only this run (default: all runs on the host).")
@click.option("--wide", is_flag=True, help="Every column, whatever the terminal's width.")
@click.option("--watch", "watch_", is_flag=True,
              help="Refresh until the run (--run, else the live or newest one) ends.")
@click.option("--interval", type=POSITIVE_SECONDS, default=2.0, show_default=True,
              help="Seconds between refreshes with --watch.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts).")
@GROUP_OPTION
@click.pass_obj
def status(app, host_name, run_id, wide, watch_, interval, as_json, group_name):
    """A table of the host's runs: state, step, tok/s and its trend, fallback, checkpoint.

    A terminal shows run, state, step, tok/s and fallback always, then the trend, the
    acceptance length, checkpoint, goodput (the share of the run's time spent training),
    attempt, uptime and last event as they fit and hold a value; --wide shows them all.
    A live run whose supervisor stopped answering shows `not_responding` and its
    heartbeat's age.
    With --group: one row per node of the group's run (--run, else the head's live or
    newest run)."""
    if group_name is not None:
        if watch_:
            raise click.UsageError("--watch and --group cannot be combined")
        return group_status(app, group_name, host_name, run_id, as_json)
    run_ops = open_run_ops(app, host_name)
    if watch_:
        if as_json:
            raise click.UsageError("--watch and --json cannot be combined")
        return watch(run_ops, run_ops.current_run(run_id), interval=interval, wide=wide)
    runs = run_ops.status(run_id)
    require_run(run_ops, run_id, runs)
    if as_json:
        click.echo(json.dumps({"host": run_ops.host.name, "runs": [r.to_json() for r in runs]},
                              default=str))
        return 0
    con = console(unlimited=wide)
    if not runs:
        con.print(f"no runs on {run_ops.host.name} (start one with `dfo launch`)", markup=False)
        return 0
    if wide or not con.is_terminal:
        # every column at its natural width: a terminal wraps the long lines, nothing is cut
        con.print(status_table(run_ops.host.name, runs, wide=True))
    else:
        con.print(status_table(run_ops.host.name, runs, width=con.width))
        # a narrow table has no room for why a run failed: say it below, whole (wrapped)
        for r in runs:
            if r.shown_status == "failed" and r.state.reason and not r.notice:
                con.print(Text(f"run {r.run_id} failed: {r.state.reason}"))
    for r in runs:
        if r.state_damaged:
            click.echo(f"dfo: warning: run {r.run_id}: {r.state_damaged}", err=True)
        if r.notice:
            click.echo(f"dfo: run {r.run_id} {r.state.status}: {r.state.reason}", err=True)
        if r.not_responding:
            click.echo(f"dfo: run {r.run_id}: {r.not_responding}", err=True)
    return 0


@click.command()
@click.option("--host", "host_name", default=None, metavar="NAME", help="Host from hosts.yaml (default: the default host).")
@click.option("--run", "run_id", default=None, metavar="ID", help="Run id (default: the live run, else the newest).")
@click.option("--timeout", type=POSITIVE_SECONDS, default=300.0, show_default=True,
              help="Seconds to wait for the run to end.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts).")
@GROUP_OPTION
@click.pass_obj
def stop(app, host_name, run_id, timeout, as_json, group_name):
    """Stop a run: the trainer checkpoints and exits; the run ends `stopped`.

    With --group: every node at once; the head writes the one checkpoint."""
    if group_name is not None:
        return group_stop(app, group_name, host_name, run_id, timeout, as_json)
    run_ops = open_run_ops(app, host_name)
    if run_id:
        require_run(run_ops, run_id, run_ops.status(run_id))
    out = run_ops.stop(run_id, timeout=timeout)
    if as_json:
        click.echo(json.dumps(out.to_json(), default=str))
        return 0
    info = out.run
    if out.nothing_to_stop:
        click.echo(f"nothing to stop on {run_ops.host.name}: run {info.run_id} is "
                   f"{info.shown_status}, not live")
        return 0
    ck = info.state.last_checkpoint
    click.echo(f"run {info.run_id}: {info.shown_status}"
               + (f", last checkpoint step_{ck.step}" if ck and ck.step is not None else ""))
    return 0


COMMANDS = [status, stop]
