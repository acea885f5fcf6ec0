"""``dfo deploy``: click only (parse, call, print). The work is in orchestrator.engine.deploy."""

from __future__ import annotations

import json

import click
from rich.table import Table

from .console import console
from .params import group_option, host_or_group

from ..common.errors import DfoError, DriftError


class _StageView:
    """Output for people: a spinner for the running stage (timestamped lines in a pipe), one
    line per finished one."""

    ICON = {"done": "[green]✓[/]", "skip": "[dim]·[/]", "fail": "[red]✗[/]"}

    def __init__(self, con):
        from .console import Activity

        self.act = Activity("deploy", con=con).__enter__()

    def __call__(self, stage: str, status: str, seconds, detail: str) -> None:
        if status in ("start", "line"):
            self.act.update(f"{stage}: {detail}" if detail else stage)
        else:
            secs = f"{seconds:6.2f}s" if seconds else "      -"
            style = "dim" if status == "skip" else ""
            self.act.line(f"{self.ICON.get(status, ' ')} {stage:<12} {secs}  "
                          f"[{style or 'default'}]{_esc(detail)}[/]")

    def close(self) -> None:
        self.act.close()


def _esc(s: str) -> str:
    from rich.markup import escape

    return escape(s or "")


@click.command("deploy")
@click.option("--host", "host_name", default=None, metavar="NAME", help="Host from hosts.yaml (default: the default host).")
@click.option("--check", is_flag=True, help="Compare the deployed env with its lock; exit 7 on drift.")
@click.option("--rollback", is_flag=True, help="Switch envs/current back to envs/previous (verified).")
@click.option("--force", is_flag=True, help="Reinstall every package and re-verify, even when up to date.")
@click.option("--profile", "profile", default=None, metavar="NAME|DIR",
              help="Use this profile instead of the host's `profile:` (a name or a directory).")
@click.option("--find-links", "find_links", multiple=True, metavar="DIR|URL",
              help="Also take wheels from here (a directory on the target, or a page of links such "
                   "as https://download.pytorch.org/whl/cpu/torch/); repeatable.")
@group_option("Deploy")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts).")
@click.pass_obj
def deploy(app, host_name, check, rollback, force, profile, find_links, group_name, as_json):
    """Build, verify and switch to the host's pinned environment.

    The env is a uv venv in <root>/envs/<profile>-<lockhash>/ installed with
    `uv pip sync --require-hashes` from the profile's lock, plus dfo's own wheel.
    A probe checks it against the profile before envs/current is switched to it.
    A repair or update builds a new env beside the current one (<name>.2, .3, ...):
    a deploy that fails or is interrupted leaves envs/current as it was.
    """
    from ..engine.deploy import Deployer

    if check and rollback:
        raise click.UsageError("--check and --rollback cannot be combined")
    host_or_group(host_name, group_name)
    if group_name is not None:
        action = "check" if check else "rollback" if rollback else "deploy"
        return _deploy_group(app, group_name, action, profile, force, as_json, find_links)
    view = None if as_json else _StageView(console(stderr=True))
    host = app.host(host_name)
    report = None
    try:
        transport = app.transport(host_name)
        d = Deployer(transport, host, profile=profile, on_event=view, find_links=find_links)
        if check:
            report = d.check()
        elif rollback:
            report = d.rollback()
        else:
            report = d.deploy(force=force)
    except DfoError as e:
        if view:
            view.close()
        if as_json:
            click.echo(json.dumps({"ok": False, "host": host.name, "error": str(e),
                                   "error_type": type(e).__name__, "exit_code": e.exit_code}))
        raise
    finally:
        if view:
            view.close()

    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        out = console()
        if check:
            if report.ok:
                out.print(f"[green]ok[/] {host.name}: {report.message} ({report.env})")
            else:
                out.print(f"[red]drift[/] on {host.name} (envs/current vs {report.env}):")
                for line in report.drift:
                    out.print(f"  {_esc(line)}")
        else:
            out.print(f"[green]{report.action}[/] {host.name}: {_esc(report.message)} "
                      f"[dim]({report.total_seconds:.2f}s)[/]")
            fp = report.fingerprint
            if fp is not None and not as_json and report.action != "noop":
                t = Table(show_header=False, box=None, padding=(0, 2))
                for k, v in (("python", fp.python), ("torch", fp.torch), ("torch_cuda", fp.torch_cuda),
                             ("transformers", fp.transformers), ("dfo", fp.dfo)):
                    t.add_row(k, str(v))
                out.print(t)
    if check and not report.ok and report.dfo_only:
        raise DriftError(f"{host.name}: envs/current has another dfo's wheel "
                         f"({report.dfo_only}); only dfo's own version differs, the lock's "
                         "packages match",
                         hint=f"run `dfo deploy --host {host.name}` with this dfo, or just "
                              "`dfo launch` (it switches to this dfo's wheel when an earlier "
                              "deploy left it on the host)")
    if check and not report.ok:
        first = report.drift[0] if report.drift else ""
        raise DriftError(f"{host.name}: envs/current differs from its lock "
                         f"({len(report.drift)} difference(s), first: {first})",
                         hint="run `dfo deploy` to repair it")
    return 0


def _figures(r) -> str:
    """A member's key figures for the summary table."""
    if r is None:
        return ""
    fp = r.fingerprint
    torch = f", torch {fp.torch}" if fp is not None and fp.torch else ""
    if r.action == "check":
        return (f"matches its lock ({r.env})" if r.ok else
                f"drift: {len(r.drift)} difference(s)") + torch
    return f"{r.action} {r.env} in {r.total_seconds:.1f}s{torch}"


def _deploy_group(app, group_name, action, profile, force, as_json, find_links=()) -> int:
    from ..engine.group import worst_exit
    from ..engine.group_hosts import deploy_group
    from . import group_view as gv

    g, members = app.group_hosts(group_name)
    view = gv.rows(f"deploy {g.name}", g.hosts, as_json)
    with view:
        outs = deploy_group(members, app.transport_for, action=action, profile=profile,
                            force=force, progress=view.update, find_links=find_links)
        gv.finish_rows(view, outs, _figures)
    code = worst_exit(outs)
    if as_json:
        gv.echo_json(g.name, outs, lambda r: r.to_json(), code, action=action)
    else:
        gv.summary(f"dfo deploy{' --' + action if action != 'deploy' else ''} --group {g.name}",
                   outs, _figures)
    if code:
        click.echo(gv.failure_line("deploy", g.name, outs), err=True)
    return code


COMMANDS = [deploy]
