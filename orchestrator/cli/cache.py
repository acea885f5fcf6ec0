"""``dfo warm-cache``: click only (parse, call ``orchestrator.cache``, print)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from ..errors import ConfigError

# the one command ------------------------------------------------------------------------------


@click.command("warm-cache")
@click.option("--host", "host_name", default=None, help="Host from hosts.yaml (default: the default host).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Trainer config (YAML) whose shapes to warm; its paths are on the host.")
@click.option("--set", "sets", multiple=True, metavar="SECTION.FIELD=VALUE",
              help="Trainer config override, e.g. --set model.attention=sdpa (repeatable).")
@click.option("--from", "from_file", type=click.Path(dir_okay=False), default=None,
              help="Restore this local snapshot (.tar with its .manifest.json beside it).")
@click.option("--pull", "pull_dest", is_flag=False, flag_value=".", default=None, metavar="[DEST]",
              help="Copy this key's snapshot from the host to DEST (dir or .tar; default: .).")
@click.option("--key", "key_name", default=None,
              help="With --pull: pull this key (see --status) instead of this env's.")
@click.option("--push", "push_file", type=click.Path(dir_okay=False), default=None,
              help="Upload a local snapshot into the host's store and restore it.")
@click.option("--status", "show_status", is_flag=True, help="List the host's cache keys, sizes, last use.")
@click.option("--prune", "prune_keep", type=int, default=None, metavar="K",
              help="Delete all but the newest K keys (live cache and snapshot).")
@click.option("--rewarm", is_flag=True, help="Run the warm-up even when a snapshot exists.")
@click.option("--no-check", "no_check", is_flag=True,
              help="Skip the second (warm) warm-up that measures the time saved.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="Seconds before a remote step is stopped.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts).")
@click.pass_obj
def warm_cache(app, host_name, config_path, sets, from_file, pull_dest, key_name, push_file, show_status,
               prune_keep, rewarm, no_check, timeout, as_json):
    """Warm, snapshot, verify and restore the compile cache for the deployed env.

    Restores a snapshot for this env's key if one exists (host store or --from),
    otherwise runs `python -m trainer warmup` on the host and saves a snapshot."""
    from .. import cache as c
    from ..ops import snapshot as sn

    modes = [m for m, on in (("--from", from_file), ("--pull", pull_dest is not None),
                             ("--push", push_file), ("--status", show_status),
                             ("--prune", prune_keep is not None)) if on]
    if len(modes) > 1:
        raise ConfigError(f"warm-cache: {' and '.join(modes)} cannot be combined; give one")
    overrides = [_parse_set(s) for s in sets]
    host = app.host(host_name)
    t0 = time.monotonic()
    ui = _Ui(as_json)
    mgr = c.CacheManager(app.transport(host.name), host.layout, host=host.name, events=ui.event,
                         timeout=timeout)

    if show_status or prune_keep is not None:
        removed = mgr.prune(prune_keep) if prune_keep is not None else None
        entries, _ = mgr.status()
        _print_status(host.name, entries, removed, as_json)
        return 0

    if key_name is not None:
        if pull_dest is None:
            raise ConfigError("warm-cache: --key only goes with --pull (other modes use this env's key)")
        with ui:
            tar, man = mgr.pull(key_name, Path(pull_dest))
        res = c.WarmResult(host=host.name, key=key_name, action="pulled", tar=str(tar),
                           manifest=str(man), snapshot_size=tar.stat().st_size)
        res.seconds = round(time.monotonic() - t0, 3)
        _print_result(res, {}, as_json)
        return 0

    cfg, cfg_bytes = c.load_config(config_path, overrides)
    if not (cfg.get("compile") or {}).get("enabled", True) and not (pull_dest or push_file or from_file):
        raise ConfigError("warm-cache: nothing to warm: the config has compile.enabled false",
                          hint="add --set compile.enabled=true, and launch with it too")
    with ui:
        ui.stage("key", f"computing the cache key on {host.name}")
        key = mgr.key(cfg)
        if pull_dest is not None:
            tar, man = mgr.pull(key.key, Path(pull_dest))
            res = c.WarmResult(host=host.name, key=key.key, action="pulled", tar=str(tar),
                               manifest=str(man), snapshot_size=tar.stat().st_size)
        elif push_file or from_file:
            m = mgr.push(Path(push_file or from_file), key)
            res = _restored(c, host.name, key.key, "pushed" if push_file else "restored",
                            str(push_file or from_file), m)
        else:
            p = sn.paths(host.layout, key.key)
            plan = sn.plan_warm(from_file=False, store_has_key=mgr.read_manifest_remote(p) is not None,
                                rewarm=rewarm)
            if plan.action == "restore":
                ui.stage("restore", plan.reason)
                m = mgr.restore_from_store(key)
                res = _restored(c, host.name, key.key, "restored", f"{host.name}:{p.tar}", m)
            else:
                ui.stage("warmup", plan.reason)
                near = mgr.nearest_snapshot(key) if not rewarm else None
                res = mgr.warm(key, cfg_bytes, overrides, measure=not no_check)
                if near:
                    from ..ops.cache_key import explain_diff

                    res.source = None
                    res.note = f"nearest other snapshot {near[0]} differs in: {explain_diff(near[1])}"
    res.seconds = round(time.monotonic() - t0, 3)
    _print_result(res, key.components, as_json)
    return 0


def _restored(c, host, key, action, source, m):
    w = m.get("warmup") or {}
    return c.WarmResult(host=host, key=key, action=action, source=source,
                        cold_s=w.get("cold_s"), warm_s=w.get("warm_s"),
                        counters=w.get("counters") or {}, warm_counters=w.get("warm_counters") or {},
                        snapshot_size=m["tar"]["size"], cache_size=m["sizes"]["total"])


def _parse_set(s: str) -> tuple[str, str]:
    k, sep, v = s.partition("=")
    if not sep or "." not in k:
        raise ConfigError(f"--set {s!r}: expected SECTION.FIELD=VALUE, e.g. --set model.attention=sdpa")
    return k.strip(), v


# output ---------------------------------------------------------------------------------------

def _size(n: int | None) -> str:
    if n is None:
        return "-"
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
    """rich progress for people (stderr), nothing for --json."""

    def __init__(self, as_json: bool):
        self.as_json = as_json
        self.progress = None
        self.task = None
        self.desc = ""
        self.beats = 0

    def __enter__(self):
        if not self.as_json:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                     TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self.progress.__enter__()
            self.task = self.progress.add_task("warm-cache", total=None)
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)
            self.progress = None

    def stage(self, name: str, what: str) -> None:
        self.desc = f"{name}: {what}"
        if self.progress is not None:
            self.progress.update(self.task, description=self.desc)

    def event(self, kind: str, data) -> None:
        if kind == "stage":
            self.stage(data.get("stage", "?"), str(data.get("what", "")))
        elif kind == "heartbeat" and self.progress is not None:
            self.beats += 1
            self.progress.update(self.task, description=f"{self.desc} (alive, {self.beats} heartbeats)")
        elif kind == "phase" and self.progress is not None:
            self.progress.update(self.task, description=f"{self.desc} [{data.get('phase')}]")


def _print_result(res, components, as_json: bool) -> None:
    if as_json:
        d = res.to_json()
        d["components"] = components
        click.echo(json.dumps(d, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    head = {"warmed": "warmed and saved a snapshot", "restored": "restored a verified snapshot",
            "pushed": "pushed and restored a verified snapshot", "pulled": "pulled the snapshot"}
    con.print(f"[bold]{res.host}[/]: {head.get(res.action, res.action)} for key [cyan]{res.key}[/] "
              f"in {res.seconds:.1f}s" + (f" from {res.source}" if res.source else ""))
    if res.records:
        t = Table(title="shapes warmed")
        for col in ("device", "shape", "what", "compile", "fxgraph hit/miss", "autograd hit/miss"):
            t.add_column(col, justify="right" if col in ("compile",) else "left")
        for r in res.records:
            cn = r.get("counters") or {}
            t.add_row(r["device"], "x".join(str(x) for x in r["shape"]), r.get("what", ""),
                      _secs(r["seconds"]),
                      f"{cn.get('fxgraph_cache_hit', 0)}/{cn.get('fxgraph_cache_miss', 0)}",
                      f"{cn.get('autograd_cache_hit', 0)}/{cn.get('autograd_cache_miss', 0)}")
        con.print(t)
    s = Table(show_header=False, box=None)
    s.add_column(style="bold")
    s.add_column()
    cn, wc = res.counters or {}, res.warm_counters or {}
    if res.cold_s is not None:
        s.add_row("cold warm-up", f"{_secs(res.cold_s)}  (fxgraph hit/miss {cn.get('fxgraph_cache_hit', 0)}/"
                                  f"{cn.get('fxgraph_cache_miss', 0)}, autograd {cn.get('autograd_cache_hit', 0)}/"
                                  f"{cn.get('autograd_cache_miss', 0)})")
    if res.warm_s is not None:
        s.add_row("warm warm-up", f"{_secs(res.warm_s)}  (fxgraph hit/miss {wc.get('fxgraph_cache_hit', 0)}/"
                                  f"{wc.get('fxgraph_cache_miss', 0)}, autograd {wc.get('autograd_cache_hit', 0)}/"
                                  f"{wc.get('autograd_cache_miss', 0)})")
    if res.saved_s is not None:
        pct = f" ({100 * res.warm_s / res.cold_s:.0f}% of cold)" if res.cold_s else ""
        s.add_row("saved next start", f"{_secs(res.saved_s)}{pct}")
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
    from rich.console import Console
    from rich.table import Table

    con = Console()
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


COMMANDS = [warm_cache]
