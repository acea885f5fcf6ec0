"""``dfo hosts list|check|trust``: click only (parse, call, print)."""

from __future__ import annotations

import json
import sys

import click

from ..common.errors import ConfigError, HostKeyError
from .context import AppContext
from .params import group_option


def _console():
    from .console import console

    return console()


@click.group("hosts")
def hosts() -> None:
    """The hosts in hosts.yaml: list them, check them, trust their SSH keys."""


@hosts.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def list_cmd(app: AppContext, as_json: bool) -> None:
    """List the hosts of the inventory (the default one is marked *)."""
    inv = app.inventory
    rows = []
    for h in inv.hosts.values():
        rows.append({
            "name": h.name, "default": h.name == inv.default, "transport": h.transport,
            "target": h.describe(), "root": h.root, "profile": h.profile,
            "gpus": {"target": list(h.gpus.target), "drafter": list(h.gpus.drafter)},
            "source": h.source,
        })
    groups = [{"name": g.name, "hosts": list(g.hosts), "head": g.head, "head_addr": g.head_addr,
               "port": g.port, "coord_port": g.coord_port,
               "gpus": {h: list(d) for h, d in g.gpus.items()}, "ifname": g.ifname,
               "source": g.source} for g in inv.groups.values()]
    if as_json:
        click.echo(json.dumps({"path": str(inv.path) if inv.path else None,
                               "default": inv.default, "hosts": rows, "groups": groups}, indent=2))
        return
    from rich.table import Table

    t = Table(title=f"hosts ({inv.path or 'embedded default'})")
    for col in ("name", "transport", "target", "root", "profile", "target gpus", "drafter gpus"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"] + (" *" if r["default"] else ""), r["transport"], r["target"], r["root"],
                  r["profile"], ",".join(r["gpus"]["target"]), ",".join(r["gpus"]["drafter"]))
    _console().print(t)
    from rich.markup import escape

    for g in groups:
        _console().print(escape(f"group {g['name']}: {', '.join(g['hosts'])} (head {g['head']} at "
                                f"{g['head_addr']}:{g['port']})"))


@hosts.command("check")
@click.argument("name", required=False)
@click.option("--host", "host_name", default=None, metavar="NAME",
              help="Host from hosts.yaml, as every host command takes it (the same as NAME).")
@group_option("Check")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def check_cmd(app: AppContext, name: str | None, host_name: str | None, group_name: str | None,
              as_json: bool) -> int:
    """Check a host (default: the default host): reachable, container state, Python,
    free disk under the root, GPUs, systemd as PID 1. Exits non-zero when it is
    unreachable (3/4) or its container is not running (5).

    With --group: every member, then whether their deployed envs and profiles agree
    (exit 7 when not: run dfo deploy --group) and whether every member reaches the head
    on head_addr at port and port+1 (a short-lived listener on the head; exit 3 when not)."""
    from ..engine.hostcheck import check_host

    if name is not None and host_name is not None and name != host_name:
        raise click.UsageError(f"NAME {name} and --host {host_name} name different hosts: "
                               "give one")
    name = name if name is not None else host_name
    if name is not None and group_name is not None:
        raise click.UsageError("a host NAME and --group cannot be combined: give one "
                               "(--group checks every host of the group)")
    if group_name is not None:
        return _check_group(app, group_name, as_json)

    host = app.host(name)
    check = check_host(host, app.transport(host.name))
    if as_json:
        click.echo(json.dumps(check.to_json(), indent=2))
    else:
        _print_check(check)
    if check.exit_code and not as_json:
        click.echo(f"dfo: error: {check.error or check.problems[0]}", err=True)
    return check.exit_code


def _check_figures(f) -> str:
    """A member's key figures: python, GPUs, free disk, deployed env."""
    if f is None:
        return ""
    c = f.check
    parts = [f"python {c.python.version}" if c.python else "no python3"]
    if c.gpus is not None and c.gpus.present:
        parts.append(f"{len(c.gpus.gpus)} GPU(s)")
    if c.disk:
        parts.append(f"{_gib(c.disk.free_bytes)} free")
    fp = f.fingerprint
    parts.append(f"env {fp.profile} torch {fp.torch}" if fp else "no env deployed")
    parts += [f"problem: {p}" for p in c.problems]
    return ", ".join(parts)


def _check_group(app: AppContext, group_name: str, as_json: bool) -> int:
    from ..engine.group_hosts import check_group
    from . import group_view as gv

    g, members = app.group_hosts(group_name)
    view = gv.rows(f"check {g.name}", g.hosts, as_json)
    with view:
        res = check_group(g, members, app.transport_for, progress=view.update)
        gv.finish_rows(view, res.members, _check_figures)
    if as_json:
        click.echo(json.dumps(res.to_json(), indent=2))
    else:
        extra = [(d.host, False, str(d)) for d in res.env]
        extra += [(r.host, r.ok, ("head: " if r.role == "head" else "") + r.message)
                  for r in res.reach]
        gv.summary(f"dfo hosts check --group {g.name} (head {g.head} at {g.head_addr}:"
                   f"{g.port},{g.coord_port})", res.members, _check_figures, extra)
    if res.exit_code:
        bad = res.problems
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        click.echo(f"dfo: error: hosts check --group {g.name}: {bad[0] if bad else 'failed'}{more}",
                   err=True)
    return res.exit_code


def _yes_no(v: bool | None) -> str:
    return "-" if v is None else ("[green]yes[/]" if v else "[red]no[/]")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _print_check(c) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"dfo hosts check {escape(c.host)}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("found")
    t.add_row("target", escape(f"{c.target} ({c.transport})"))
    t.add_row("reachable", _yes_no(c.reachable))
    if c.transport == "proxmox" and c.reachable:
        st = c.container or "-"
        t.add_row("container", f"[green]{st}[/]" if st == "running" else f"[red]{escape(st)}[/]")
    if c.kernel:
        t.add_row("kernel", escape(c.kernel))
    if c.reachable and c.container in (None, "running") and not c.error:
        t.add_row("python", escape(f"{c.python.version} ({c.python.executable})") if c.python else "[red]none[/]")
        if c.disk:
            t.add_row("free disk", escape(f"{_gib(c.disk.free_bytes)} of {_gib(c.disk.total_bytes)} under "
                                          f"{c.root} (on {c.disk.mount})"))
        else:
            t.add_row("free disk", "[red]unknown[/]")
        g = c.gpus
        if g is None or not g.present:
            t.add_row("gpus", "none (no nvidia-smi)")
        elif g.error:
            t.add_row("gpus", f"[red]{escape(g.error)}[/]")
        else:
            t.add_row("gpus", escape(", ".join(f"{x.index}: {x.name}" + (f" {x.memory_mib} MiB" if x.memory_mib else "")
                                               for x in g.gpus) or "none"))
        _gpu_rows(t, c.gpu)
        t.add_row("systemd pid 1", _yes_no(c.systemd_pid1) + (f" ({escape(c.init)})" if c.init and c.init != "systemd" else ""))
    for p in c.problems:
        t.add_row("[yellow]problem[/]", escape(p))
    _console().print(t)


def _gpu_rows(t, f) -> None:
    """Driver, CUDA, memory in use, /dev/shm and memlock (plan/gpu.py facts)."""
    from rich.markup import escape

    if f is None or not f.present:
        if f is not None:
            t.add_row("gpu driver", "no GPU")
        return
    t.add_row("gpu driver", escape(f"{f.driver_version or '?'} (runs CUDA <= {f.max_cuda or '?'})"))
    if f.query and f.query.gpus:
        used = ", ".join(f"{g.index}: {g.memory_used_mib if g.memory_used_mib is not None else '?'} MiB"
                         for g in f.query.gpus)
        t.add_row("gpu memory in use", escape(used + (f"; {len(f.apps)} process(es)" if f.apps else "")))
    if f.shm:
        t.add_row("/dev/shm", escape(_gib(f.shm.total_bytes)))
    if f.memlock_known:
        t.add_row("memlock", "unlimited" if f.memlock_kib is None else f"{f.memlock_kib} KiB")


@hosts.command("trust")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Record the key without asking.")
@click.option("--replace", is_flag=True,
              help="Replace a CHANGED key (only after verifying the new one out of band).")
@click.option("--fingerprint", "expect_fp", default=None, metavar="SHA256:...",
              help="The key's fingerprint as verified out of band; required with --yes --replace.")
@click.pass_obj
def trust_cmd(app: AppContext, name: str, yes: bool, replace: bool, expect_fp: str | None) -> None:
    """Show a host's SSH key fingerprint and record it in its known_hosts file."""
    from ..transport import knownhosts
    from ..transport.trust import trust_hosts

    host = app.host(name)
    if host.ssh is None:
        raise ConfigError(f"host {name} uses transport local: there is no SSH key to trust")
    if yes and replace and not expect_fp:
        raise ConfigError("dfo hosts trust --yes --replace would accept any new key unseen",
                          hint="verify the new key out of band and pass --fingerprint SHA256:...")
    kh = host.ssh.known_hosts_path
    if not yes and not sys.stdin.isatty() and not _all_recorded(host.ssh):
        raise ConfigError("dfo hosts trust needs a terminal to ask; check the fingerprint and pass --yes")

    def decide(label, kh_name, key, status) -> bool:
        fp = knownhosts.describe_key(key)
        if expect_fp and status != knownhosts.KNOWN and knownhosts.fingerprint(key) != expect_fp:
            raise HostKeyError(f"{label} ({kh_name}) offers {fp}, not the expected {expect_fp}",
                               hint="nothing was recorded; check which key the host really has")
        if status == knownhosts.CHANGED:
            if not replace:
                raise HostKeyError(
                    f"REMOTE HOST KEY CHANGED for {label} ({kh_name}): it now offers {fp}, which differs "
                    f"from {kh}; someone may be intercepting the connection",
                    hint=f"if the host was reinstalled, verify the new key and run "
                         f"`dfo hosts trust {name} --replace --fingerprint SHA256:...`")
            click.echo(f"WARNING: the key of {label} ({kh_name}) CHANGED; it now offers {fp}", err=True)
        else:
            click.echo(f"{label} ({kh_name}) offers {fp}")
        if yes:
            return True
        if not sys.stdin.isatty():      # asked only for a key not yet trusted
            raise ConfigError("dfo hosts trust needs a terminal to ask",
                              hint="check the fingerprint above and pass --yes")
        return click.confirm(f"Record this key in {kh}?", default=False)

    for label, fp, outcome in trust_hosts(name, host.ssh, decide):
        verb = {"known": "already trusted", "added": "trusted", "replaced": "key replaced",
                "skipped": "not trusted"}[outcome]
        click.echo(f"{label}: {verb}: {fp}")


def _all_recorded(settings) -> bool:
    """Every hop (jump hosts and the host) has a key recorded in its known_hosts file: a
    trust without a terminal then only checks them, and asks only if one differs."""
    from ..transport import knownhosts
    from ..transport.ssh import jump_hops

    return all(knownhosts.lookup(s.known_hosts_path, s.host_key_name)
               for s in [*jump_hops(settings), settings])


COMMANDS = [hosts]
