"""``dfo warm-cache``: click only (parse, call ``orchestrator.engine.cache_command``, print)."""

from __future__ import annotations

import json
import time

import click

from .params import POSITIVE_SECONDS, group_option, host_or_group


# the one command ------------------------------------------------------------------------------


@click.command("warm-cache")
@click.option("--host", "host_name", default=None, metavar="NAME", help="Host from hosts.yaml (default: the default host).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Trainer config (YAML) whose shapes to warm; its paths are on the host "
                   "(default: the one `dfo launch` uses without --config). --pull, --from and "
                   "--push need none.")
@click.option("--set", "sets", multiple=True, metavar="SECTION.FIELD=VALUE",
              help="Trainer config override, e.g. --set model.attention=sdpa (repeatable).")
@click.option("--from", "from_file", type=click.Path(dir_okay=False), default=None,
              help="Restore this local snapshot (.tar with its .manifest.json beside it).")
@click.option("--pull", "pull_dest", is_flag=False, flag_value=".", default=None, metavar="[DEST]",
              help="Copy this key's snapshot from the host to DEST (dir or .tar; default: .).")
@click.option("--key", "key_name", default=None, metavar="KEY",
              help="With --pull: pull this key (see --status) instead of this env's.")
@click.option("--push", "push_file", type=click.Path(dir_okay=False), default=None,
              help="Upload a local snapshot into the host's store and restore it.")
@click.option("--status", "show_status", is_flag=True,
              help="List the host's cache keys, sizes, last use; verify the stored snapshots "
                   "and the live caches (files that cannot be loaded).")
@click.option("--prune", "prune_keep", type=click.IntRange(min=0), default=None, metavar="K",
              help="Delete all but the newest K keys (live cache and snapshot).")
@click.option("--trust-other-hosts", "trust_other_hosts", is_flag=True,
              help="Take a snapshot another host built (it carries compiled code torch runs).")
@click.option("--rewarm", is_flag=True, help="Run the warm-up even when a snapshot exists.")
@click.option("--no-check", "no_check", is_flag=True,
              help="Skip the second (warm) warm-up that measures the time saved.")
@click.option("--timeout", type=POSITIVE_SECONDS, default=None, help="Seconds before a remote step is stopped.")
@group_option("Warm (or restore)")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts).")
@click.pass_obj
def warm_cache(app, host_name, config_path, sets, from_file, pull_dest, key_name, push_file, show_status,
               prune_keep, trust_other_hosts, rewarm, no_check, timeout, group_name, as_json):
    """Warm, snapshot, verify and restore the compile cache for the deployed env.

    Restores a snapshot for this env's key if one exists (host store or --from),
    otherwise runs `python -m trainer warmup` on the host and saves a snapshot."""
    from ..engine.cache_command import WarmCacheRequest, status_problems, warm_cache as run
    from ..engine.compile_cache import CacheManager
    from ..plan.launch_inputs import parse_sets

    req = WarmCacheRequest(config_path=config_path, overrides=parse_sets(sets),
                           from_file=from_file, pull_dest=pull_dest, key_name=key_name,
                           push_file=push_file, show_status=show_status, prune_keep=prune_keep,
                           rewarm=rewarm, check=not no_check, trust_other_hosts=trust_other_hosts)
    req.validate()
    host_or_group(host_name, group_name)
    if group_name is not None:
        return _warm_group(app, group_name, req, timeout, as_json)
    host = app.host(host_name)
    ui = _Ui(as_json)
    mgr = CacheManager(app.transport(host.name), host.tree, host=host.name, events=ui.event,
                       timeout=timeout, trusted_sources=host.cache_trusted_sources)
    if show_status or prune_keep is not None:
        out = run(mgr, req)
        _print_status(host.name, out.entries, out.removed, as_json)
        bad = status_problems(host.name, out.entries or [])
        if bad is not None:
            raise bad
        return 0
    with ui:
        out = run(mgr, req, stage=ui.stage)
    _print_result(out.result, out.components, as_json)
    return 0


def _warm_figures(out) -> str:
    r = out.result if out is not None else None
    if r is None:
        return ""
    fig = f"{r.action} {r.key} in {r.seconds:.1f}s"
    if r.saved_s is not None:
        fig += f", saves {_secs(r.saved_s)} a start"
    return fig


def _warm_group(app, group_name, req, timeout, as_json) -> int:
    from ..engine.group import worst_exit
    from ..engine.group_hosts import warm_cache_group
    from . import group_view as gv

    modes = [m for m, on in (("--from", req.from_file), ("--pull", req.pull_dest is not None),
                             ("--push", req.push_file), ("--status", req.show_status),
                             ("--prune", req.prune_keep is not None), ("--key", req.key_name))
             if on]
    if modes:
        raise click.UsageError(f"{modes[0]} works on one host: use --host NAME (--group warms "
                               f"or restores every member's cache)")
    g, members = app.group_hosts(group_name)
    view = gv.rows(f"warm-cache {g.name}", g.hosts, as_json)
    with view:
        outs = warm_cache_group(members, app.transport_for, req, timeout=timeout,
                                progress=view.update)
        gv.finish_rows(view, outs, _warm_figures)
    code = worst_exit(outs)
    if as_json:
        def value(out):
            d = out.result.to_json()
            d["components"] = out.components
            return d
        gv.echo_json(g.name, outs, value, code)
    else:
        gv.summary(f"dfo warm-cache --group {g.name}", outs, _warm_figures)
    if code:
        click.echo(gv.failure_line("warm-cache", g.name, outs), err=True)
    return code




# output ---------------------------------------------------------------------------------------

def _size(size: int | None) -> str:
    if size is None:
        return "-"
    n = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}s"


def _when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%m-%d %H:%M", time.localtime(ts))


class _Ui:
    """Progress for people on stderr (a spinner in a terminal, timestamped lines in a pipe),
    nothing for --json."""

    def __init__(self, as_json: bool):
        from .console import Activity

        self.act = Activity("warm-cache", enabled=not as_json)
        self.desc = ""
        self.beats = 0

    def __enter__(self):
        self.act.__enter__()
        return self

    def __exit__(self, *exc):
        self.act.__exit__(*exc)

    def stage(self, name: str, what: str) -> None:
        self.desc = f"{name}: {what}"
        self.act.update(self.desc)

    def event(self, kind: str, data) -> None:
        """``stage``: a step of the command ({"stage", "what"}); ``marker``: a trainer marker
        of the warm-up (``dfo_contract.trainer_markers``)."""
        from dfo_contract.trainer_markers import HeartbeatMarker, PhaseMarker

        if kind == "stage":
            self.stage(data.get("stage", "?"), str(data.get("what", "")))
        elif isinstance(data, HeartbeatMarker):
            self.beats += 1
            if not self.act.plain:  # in a pipe the steady lines already say it is alive
                self.act.update(f"{self.desc} (alive, {self.beats} heartbeats)")
        elif isinstance(data, PhaseMarker):
            self.act.update(f"{self.desc} [{data.phase}]")


def _print_result(res, components, as_json: bool) -> None:
    if as_json:
        d = res.to_json()
        d["components"] = components
        click.echo(json.dumps(d, sort_keys=True))
        return
    from rich.table import Table

    from .console import console

    con = console()
    head = {"warmed": "warmed and saved a snapshot", "restored": "restored a verified snapshot",
            "pushed": "pushed and restored a verified snapshot", "pulled": "pulled the snapshot"}
    con.print(f"[bold]{res.host}[/]: {head.get(res.action, res.action)} for key [cyan]{res.key}[/] "
              f"in {res.seconds:.1f}s" + (f" from {res.source}" if res.source else ""))
    if res.records:
        t = Table(title="shapes warmed")
        for col in ("device", "shape", "what", "compile", "fxgraph hit/miss", "autograd hit/miss"):
            t.add_column(col, justify="right" if col in ("compile",) else "left")
        for r in res.records:
            cn = r.counters
            t.add_row(r.device, "x".join(str(x) for x in r.shape), r.what, _secs(r.seconds),
                      f"{cn.get('fxgraph_cache_hit', 0)}/{cn.get('fxgraph_cache_miss', 0)}",
                      f"{cn.get('autograd_cache_hit', 0)}/{cn.get('autograd_cache_miss', 0)}")
        con.print(t)
    s = Table(show_header=False, box=None)
    s.add_column(style="bold", no_wrap=True)
    s.add_column(overflow="fold")     # a path longer than the terminal folds, never cut
    cn, wc = res.counters or {}, res.warm_counters or {}
    # a restore ran no warm-up: its figures are the snapshot's, measured when it was saved
    at = (lambda label: label) if res.action == "warmed" else (lambda label: f"{label} (at save)")
    if res.cold_s is not None:
        s.add_row(at("cold warm-up"), f"{_secs(res.cold_s)}  (fxgraph hit/miss {cn.get('fxgraph_cache_hit', 0)}/"
                                  f"{cn.get('fxgraph_cache_miss', 0)}, autograd {cn.get('autograd_cache_hit', 0)}/"
                                  f"{cn.get('autograd_cache_miss', 0)})")
    if res.warm_s is not None:
        s.add_row(at("warm warm-up"), f"{_secs(res.warm_s)}  (fxgraph hit/miss {wc.get('fxgraph_cache_hit', 0)}/"
                                  f"{wc.get('fxgraph_cache_miss', 0)}, autograd {wc.get('autograd_cache_hit', 0)}/"
                                  f"{wc.get('autograd_cache_miss', 0)})")
    if res.saved_s is not None:
        pct = f" ({100 * res.warm_s / res.cold_s:.0f}% of cold)" if res.cold_s else ""
        s.add_row(at("saved next start"), f"{_secs(res.saved_s)}{pct}")
    s.add_row("snapshot", f"{_size(res.snapshot_size)} tar, {_size(res.cache_size)} of cache files")
    if res.tar:
        s.add_row("file", res.tar)
    if res.note:
        s.add_row("note", res.note)
    con.print(s)


def _print_status(host: str, entries, removed, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"host": host, "removed": removed,
                               "keys": [dict(e.__dict__) for e in entries]}, sort_keys=True))
        return
    from rich.table import Table

    from .console import console

    con = console()
    if removed is not None:
        con.print(f"pruned {len(removed)} key(s)" + (f": {', '.join(removed)}" if removed else ""))
    if not entries:
        con.print(f"{host}: no compile caches yet (run `dfo warm-cache`)")
        return
    t = Table(title=f"compile caches on {host}")
    for col in ("key", "live cache", "snapshot", "created", "last use"):
        t.add_column(col, no_wrap=True)
    for e in entries:
        t.add_row(e.key, _size(e.live_size), _size(e.snapshot_size), _when(e.created), _when(e.last_used))
    con.print(t)
    from rich.markup import escape

    for e in entries:
        if e.problem:
            con.print(f"[red]BAD[/] {escape(e.key)}: {escape(e.problem)}")
        if e.live_problem:
            con.print(f"[red]DAMAGED[/] {escape(e.key)}: {escape(e.live_problem)}")
    if removed is None and not any(e.problem for e in entries):
        n = sum(1 for e in entries if e.snapshot_size is not None)
        con.print(f"{n} stored snapshot(s) verified (manifest, tar checksum, members)")


COMMANDS = [warm_cache]
