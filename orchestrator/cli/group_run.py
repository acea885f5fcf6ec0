"""``--group NAME`` for ``dfo launch``, ``dfo logs``, ``dfo status``, ``dfo stop``: one
multi-node run on every node of a hosts.yaml group (docs/multinode.md). Click only."""

from __future__ import annotations

import contextlib
import json
import shlex
import time

import click
from rich.markup import escape

from dfo_contract.status import RunStatus

from ..common.errors import EXIT_INTERRUPTED, DfoError, RunFailed
from .console import Activity, console, note, print_launch
from .log_lines import JsonLinePrinter, LinePrinter, skipped_note
from .params import host_or_group


def group_runs(app, group_name, host_name, say=None):
    """The GroupRuns of ``--group NAME`` (never with ``--host``: exit 2)."""
    from ..engine.group_runs import GroupRuns

    host_or_group(host_name, group_name)
    group = app.inventory.group(group_name)
    hosts = [app.host(n) for n in group.hosts]
    return GroupRuns(group, hosts, app.transport,
                     say=say or note)


GROUP_OPTION = click.option("--group", "group_name", default=None, metavar="NAME",
                            help="A group from hosts.yaml: act on every node of one multi-node "
                                 "run (docs/multinode.md).")


def launch_group(app, group_name, host_name, opts, *, as_json: bool, follow: bool) -> int:
    with Activity("launch", enabled=not as_json) as act:
        gr = group_runs(app, group_name, host_name, say=lambda m: act.line(f"dfo: {escape(m)}"))
        act.update(f"checking the {len(gr.hosts)} nodes of {group_name}, their envs and the config"
                   + ("" if opts.dry_run else "; then starting the run on each"))
        gp = gr.launch(opts)
    if as_json:
        d = gp.to_json()
        d["started"] = not opts.dry_run
        click.echo(json.dumps(d))
    else:
        print_group_plan(gp, opts.dry_run)
    if follow and not opts.dry_run:
        return follow_group_logs(gr, gp.run_id, follow=True, raw=False, attempt=None,
                                 since=None, from_attempt=1)
    return 0


def print_group_plan(gp, dry_run: bool) -> None:
    hosts = ", ".join(n.host for n in gp.nodes)
    rows = [f"  resume       {escape(gp.head.plan.resume_path or 'from scratch')} (on the head)"]
    for n in gp.nodes:
        p = n.plan
        rows += [f"  node {n.index} {escape(n.host)}{' (head)' if n.index == 0 else ''}: "
                 f"{n.group.nproc} process(es), {p.mode}",
                 f"    run dir    {escape(p.run_dir)}",
                 f"    start      {escape(shlex.join(p.start_argv))}",
                 f"    attempt 1  {escape(shlex.join(n.attempt_argv))}",
                 *(f"    env        {escape(k)}={escape(v)}" for k, v in sorted(n.group.env.items()))]
    print_launch(gp.warnings, dry_run=dry_run, rows=rows,
                 launched=f"[green]launched[/] {escape(gp.run_id)} on group {escape(gp.group)} "
                          f"({escape(hosts)}); follow with: dfo logs -f --group {escape(gp.group)}",
                 title=f"[bold]plan[/] run {escape(gp.run_id)} on group {escape(gp.group)} "
                       f"({len(gp.nodes)} nodes, layout ddp)")


def follow_group_logs(gr, run_id, *, follow, raw, attempt, since, from_attempt,
                      as_json: bool = False) -> int:
    from ..engine.group_logs import follow_group
    from ..plan.timespec import parse_since

    err = console(stderr=True)
    width = max(len(h.name) for h in gr.hosts)
    printers = {h.name: JsonLinePrinter(h.name) if as_json else
                LinePrinter(raw, prefix=f"{h.name:<{width}} | ") for h in gr.hosts}
    nodes = [(h.name, gr.run_ops(h.name).transport, gr.run_ops(h.name).tree) for h in gr.hosts]
    try:
        with contextlib.ExitStack() as beats:
            for pr in printers.values():
                if isinstance(pr, LinePrinter):
                    beats.enter_context(pr.beat(follow))
            outs = follow_group(
                nodes, run_id, on_line=lambda host, ln: printers[host](ln), follow=follow,
                attempt=attempt, from_attempt=from_attempt,
                since=parse_since(since, time.time()),
                on_reconnect=lambda host, n, why: err.print(
                    f"[yellow]dfo: {escape(host)}: connection lost ({escape(why)}); "
                    f"reconnecting ({n})[/]"),
                on_skipped=lambda host, n: err.print(
                    f"[yellow]{escape(skipped_note(n, f'{host}: '))}[/]"))
    except KeyboardInterrupt:
        err.print(f"dfo: detached; run {escape(run_id)} goes on "
                  f"(dfo logs -f --group {escape(gr.group.name)})")
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
    gr.raise_failed(outs, f"following run {run_id}")
    if follow:
        for o in outs:
            if o.value in ("failed", "lost"):
                runs = []
                try:
                    runs = gr.run_ops(o.host).status(run_id)
                except DfoError:
                    pass       # the status only adds the reason to the message
                why = (runs[0].state.reason if runs else None) if o.value == "failed" \
                    else "its supervisor is gone (lost)"
                raise RunFailed(f"run {run_id} {o.value} on node {gr.index(o.host)} "
                                f"({o.host}): {why}",
                                hint=f"see `dfo logs --group {gr.group.name}` and docs/multinode.md")
        states = ", ".join(f"{o.host} {o.value}" for o in outs)
        err.print(f"dfo: run {escape(run_id)}: {escape(states)}")
    return 0


# --- status / stop ---------------------------------------------------------------------------

def status_lines(group: str, run_id: str, rows: list[dict], width: int = 80) -> list[str]:
    """``dfo status --group``: a title and one row per node (node, host, state, attempt,
    step, last event), no line longer than ``width``; the last event is cut to fit."""
    hw = max([4] + [len(str(row["host"])) for row in rows])
    head = f"{'node':>4}  {'host':<{hw}}  {'state':<9} {'attempt':>7} {'step':>7}  last event"
    out = [f"run {run_id} on group {group}"[:width], head[:width]]
    for row in rows:
        line = (f"{row['node']:>4}  {str(row['host']):<{hw}}  {str(row['state']):<9} "
                f"{str(row['attempt']):>7} {str(row['step']):>7}  {row['last_event']}")
        out.append(line if len(line) <= width else line[:width - 1] + "…")
    return out


def _row(index: int, outcome) -> dict:
    if not outcome.ok:
        return {"node": index, "host": outcome.host, "state": "error", "attempt": "-",
                "step": "-", "last_event": outcome.error}
    r: RunStatus = outcome.value
    step = r.state.last_step
    return {"node": index, "host": outcome.host, "state": r.shown_status or "?",
            "attempt": str(r.state.attempt or 0), "step": "-" if step is None else str(step),
            "last_event": str(r.state.last_event or "-")}


def group_status(app, group_name, host_name, run_id, as_json: bool) -> int:
    from ..engine.group import worst_exit

    gr = group_runs(app, group_name, host_name)
    rid, outs = gr.status(run_id)
    if as_json:
        click.echo(json.dumps({"group": group_name, "run_id": rid, "nodes": [
            {"node": i, "host": o.host, "ok": o.ok, "error": o.error,
             "run": o.value.to_json() if o.ok else None}
            for i, o in enumerate(outs)]}, default=str))
    else:
        rows = [_row(i, o) for i, o in enumerate(outs)]
        for line in status_lines(group_name, rid, rows, width=80):
            click.echo(line)
    code = worst_exit(outs)
    if code and not as_json:
        bad = next(o for o in outs if not o.ok)
        click.echo(f"dfo: error: node {gr.index(bad.host)} ({bad.host}): {bad.error}", err=True)
    return code


def group_stop(app, group_name, host_name, run_id, timeout: float, as_json: bool) -> int:
    from ..engine.group import worst_exit

    gr = group_runs(app, group_name, host_name)
    rid, outs = gr.stop(run_id, timeout=timeout)
    ck = outs[0].value.run.state.last_checkpoint if outs[0].ok else None
    if as_json:
        click.echo(json.dumps({"group": group_name, "run_id": rid,
                               "checkpoint": ck.to_json() if ck else None, "nodes": [
                                   {"node": i, "host": o.host, "ok": o.ok, "error": o.error,
                                    "run": o.value.to_json() if o.ok else None}
                                   for i, o in enumerate(outs)]}, default=str))
    else:
        states = ", ".join(f"{o.host} {o.value.run.shown_status}" if o.ok else f"{o.host} error"
                           for o in outs)
        click.echo(f"run {rid}: {states}"
                   + (f"; checkpoint step_{ck.step} on {outs[0].host}"
                      if ck and ck.step is not None else "; no checkpoint"))
    code = worst_exit(outs)
    if code:
        bad = [(gr.index(o.host), o.host, o.error, o.exit_code) for o in outs if not o.ok]
        from ..plan.group_launch import nodes_error

        raise nodes_error(bad, f"stopping run {rid}")
    return 0
