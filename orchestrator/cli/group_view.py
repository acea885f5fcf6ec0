"""Output of ``--group`` commands: the live rows while the members work (console.HostRows),
then one summary table (host, result, key figures; fits 80 columns) or one JSON object."""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

import click

from .console import HostRows, console

#: the summary fits an 80-column terminal: host 14 + result 9 + figures + borders
SUMMARY_WIDTH = 80


def rows(label: str, hosts: Sequence[str], as_json: bool) -> HostRows:
    return HostRows(label, hosts, enabled=not as_json)


def finish_rows(view: HostRows, outcomes, figures: Callable[[Any], str]) -> None:
    for o in outcomes:
        view.finish(o.host, o.ok, figures(o.value) if o.ok else (o.error or "failed"))


def result_word(o) -> str:
    return "[green]ok[/]" if o.ok else f"[red]failed[/] ({o.exit_code})"


def summary(title: str, outcomes, figures: Callable[[Any], str],
            extra: Sequence[tuple[str, bool, str]] = ()) -> None:
    """The table: one row per host, then ``extra`` rows (host, ok, text) after a rule."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    con = console()
    t = Table(title=escape(title), box=box.SIMPLE_HEAD, width=min(SUMMARY_WIDTH, con.width),
              title_justify="left")
    t.add_column("host", no_wrap=True, max_width=16)
    t.add_column("result", no_wrap=True)
    t.add_column("figures", overflow="fold", ratio=1)
    for i, o in enumerate(outcomes):
        text = figures(o.value) if o.ok else (o.error or "failed")
        t.add_row(escape(o.host), result_word(o), escape(text),
                  end_section=bool(extra) and i == len(outcomes) - 1)
    for host, ok, text in extra:
        t.add_row(escape(host), "[green]ok[/]" if ok else "[red]failed[/]", escape(text))
    con.print(t)


def echo_json(group: str, outcomes, value_json: Callable[[Any], Any], exit_code: int,
              **more: Any) -> None:
    d = {"group": group, "ok": exit_code == 0, "exit_code": exit_code,
         "hosts": [{"host": o.host, "ok": o.ok, "error": o.error, "exit_code": o.exit_code,
                    "result": value_json(o.value) if o.value is not None else None}
                   for o in outcomes]}
    d.update(more)
    click.echo(json.dumps(d, sort_keys=True))


def failure_line(what: str, group: str, outcomes) -> str:
    """The last stderr line of a group command with a failed member."""
    bad = [o for o in outcomes if not o.ok]
    first = bad[0]
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"dfo: error: {what} --group {group}: {len(bad)} of {len(outcomes)} host(s) failed; " \
           f"first: {first.host}: {first.error}{more}"
