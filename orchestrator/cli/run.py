"""``dfo launch``, ``dfo logs``, ``dfo status``, ``dfo stop``, ``dfo diagnose``: click only."""

from __future__ import annotations

import json
import math
import shlex
import time

import click

from .params import NON_NEGATIVE, POSITIVE_SECONDS
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..errors import EXIT_INTERRUPTED, ConfigError, RunFailed


def _kv(items, what: str, conv=float) -> dict:
    out = {}
    for it in items:
        if "=" not in it:
            raise ConfigError(f"{what} {it!r}: expected KEY=VALUE")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = conv(v)
        except ValueError:
            raise ConfigError(f"{what} {it!r}: {v!r} is not a number") from None
    return out


def _ops(app, host_name):
    from ..engine.runs import RunOps

    host = app.host(host_name)
    return RunOps(app.transport(host_name), host, say=lambda m: click.echo(f"dfo: {m}", err=True))


# --- launch ----------------------------------------------------------------------------------

@click.command()
@click.option("--host", "host_name", default=None, help="Host from hosts.yaml (default: the default host).")
@click.option("--resume", default=None, metavar="step_N|latest|PATH",
              help="Checkpoint to start from: a name, 'latest', or a path under the host's root.")
@click.option("--config", "config", default=None, type=click.Path(dir_okay=False),
              help="Run config (trainer YAML); default: the shipped tiny-cpu.yaml.")
@click.option("--run-name", default=None, help="Run name (checkpoints/<run-name>/); default: config stem.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Config override, e.g. --set train.micro_batch=4 (repeatable).")
@click.option("--replace", is_flag=True, help="Stop the host's live run first.")
@click.option("--new-lineage", is_flag=True,
              help="Start over in a run name that has checkpoints: move them aside under a dated name.")
@click.option("--dry-run", is_flag=True, help="Validate and print the plan; start nothing.")
@click.option("-f", "--follow", is_flag=True, help="Then follow the logs (like dfo logs -f).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--fault", default=None, metavar="SPEC",
              help="Fault injection for tests/demos (DFO_FAULT), e.g. fx_race@5.")
@click.option("--backoff-scale", type=NON_NEGATIVE, default=1.0, show_default=True,
              help="Multiply restart backoffs (0.01 for demos and tests).")
@click.option("--threshold", "thresholds", multiple=True, metavar="NAME=SECONDS",
              help="Watchdog thresholds: warmup_s, train_s, stop_timeout_s, kill_grace_s, ...")
@click.option("--budget", "budgets", multiple=True, metavar="CLASS=N",
              help="Restart budget per class (or total=N, startup_limit=N).")
@click.option("--fallbacks", "fallbacks", multiple=True, metavar="CLASS=STEP,STEP",
              help="Replace a class's fallback ladder, e.g. oom=halve_micro_batch*.")
@click.option("--no-env-check", is_flag=True, help="Skip `dfo deploy --check` (development only).")
@click.option("--run-file", default=None, type=click.Path(dir_okay=False),
              help="Your own trainer (with -- CMD): step pattern, resume, fallback ladders (YAML).")
@click.option("--step-pattern", default=None, metavar="REGEX",
              help="Your own trainer: output lines matching it are steps (group 'step', opt. 'tok_s').")
@click.option("--resume-glob", default=None, metavar="GLOB",
              help="Your own trainer: its checkpoints, e.g. 'ckpt/step_*' (newest resumed).")
@click.option("--resume-order", type=click.Choice(["step", "mtime", "name"]), default="step",
              help="How --resume-glob's matches are ordered.")
@click.option("--resume-args", "resume_args", default=None, metavar="TEMPLATE",
              help="Your own trainer: the arguments that pass a checkpoint (default '--resume {path}').")
@click.option("--ladder", "ladder", multiple=True, metavar="CLASS=KIND:VALUE",
              help="Your own trainer: a fallback step, in order, e.g. fx_trace_race=drop_arg:--threads.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def launch(app, host_name, resume, config, run_name, sets, replace, new_lineage, dry_run, follow,
           as_json, fault, backoff_scale, thresholds, budgets, fallbacks, no_env_check,
           run_file, step_pattern, resume_glob, resume_order, resume_args, ladder, command):
    """Start a supervised training run on a host, detached (it outlives this command).

    With `-- CMD ARGS...` it supervises your own training command instead of the bundled
    trainer (docs/byo-trainer.md)."""
    from ..engine.runs import LaunchOptions

    budget: dict = {}
    per: dict = {}
    for k, v in _kv(budgets, "--budget", int).items():
        if k in ("total", "startup_limit"):
            budget[k] = v
        else:
            per[k] = v
    if per:
        budget["per_class"] = per
    fb = {}
    for it in fallbacks:
        if "=" not in it:
            raise ConfigError(f"--fallbacks {it!r}: expected CLASS=STEP,STEP")
        k, v = it.split("=", 1)
        fb[k.strip()] = [s.strip() for s in v.split(",") if s.strip()]
    opts = LaunchOptions(config=config, resume=resume, run_name=run_name, sets=sets,
                         replace=replace, dry_run=dry_run, fault=fault,
                         backoff_scale=backoff_scale, thresholds=_kv(thresholds, "--threshold"),
                         budget=budget, fallbacks=fb or None, env_check=not no_env_check,
                         new_lineage=new_lineage, command=tuple(command), run_file=run_file,
                         step_pattern=step_pattern, resume_glob=resume_glob,
                         resume_order=resume_order, resume_args=resume_args or (),
                         ladder=tuple(ladder))
    ops = _ops(app, host_name)
    plan = ops.launch(opts)
    if as_json:
        d = plan.to_json()
        d["started"] = not dry_run
        click.echo(json.dumps(d))
    else:
        _print_plan(plan, dry_run)
    if follow and not dry_run:
        return _follow(ops, plan.run_id, follow=True, raw=False, attempt=None, since=None,
                       from_attempt=1)
    return 0


def _print_plan(plan, dry_run: bool) -> None:
    c = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False)
    for w in plan.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}")
    if not dry_run:
        c.print(f"[green]launched[/] {escape(plan.run_id)} on {escape(plan.host)} "
                f"({plan.mode}); follow with: dfo logs -f --run {escape(plan.run_id)}")
        return
    c.print(f"[bold]plan[/] run {escape(plan.run_id)} on {escape(plan.host)} ({plan.mode})")
    c.print(f"  run dir      {escape(plan.run_dir)}")
    c.print(f"  resume       {escape(plan.resume_path or 'from scratch')}")
    c.print(f"  start        {escape(shlex.join(plan.start_argv))}")
    c.print(f"  attempt 1    {escape(shlex.join(plan.first_attempt_argv))}")
    c.print("  env")
    for k, v in sorted(plan.env.items()):
        c.print(f"    {escape(k)}={escape(v)}")
    from ..ops.fallback import describe

    per = (plan.spec.get("budget") or {}).get("per_class", {})
    c.print("  fallback ladders (class: steps; restart budget)")
    for cls, steps in describe(plan.ladders):
        c.print(f"    {cls:<15} {escape(steps)}; {per.get(cls, '-')}")
    b = plan.spec.get("budget") or {}
    c.print(f"  budget total {b.get('total')}, backoff {b.get('initial')}s x{b.get('factor')} "
            f"cap {b.get('cap')}s (scale {b.get('scale')}), reset after {b.get('healthy_reset')}s healthy")


# --- logs ------------------------------------------------------------------------------------

_EVENT_STYLE = {
    "supervisor_start": "dim", "attempt_start": "bold blue", "checkpoint": "green",
    "watchdog": "magenta", "stacks": "magenta", "attempt_end": "blue", "classified": "bold red",
    "fallback": "bold yellow", "restart": "cyan", "give_up": "bold red", "orphans_reaped": "yellow",
    "stopping": "yellow", "final": "bold", "cache_restore": "magenta",
}


class _Printer:
    def __init__(self, raw: bool):
        self.raw = raw
        self.c = Console(highlight=False, soft_wrap=True)

    def __call__(self, ln) -> None:
        if self.raw:
            click.echo(ln.text)
            return
        from ..ops import runstate as rs
        from ..ops.classify import match_line, parse_marker

        if ln.event is not None:
            e = ln.event
            kind = e.get("kind")
            style = _EVENT_STYLE.get(kind) or "default"
            if kind == "final":
                style = {"done": "bold green", "failed": "bold red"}.get(e.get("status"), "bold yellow")
            ts = time.strftime("%H:%M:%S", time.localtime(float(e.get("t") or 0)))
            self.c.print(f"[dim]{ts}[/] [{style}]▶ {escape(rs.describe_event(e))}[/]")
            for ev in (e.get("evidence") or [])[:6]:
                self.c.print(f"           [red]│ {escape(str(ev.get('text', '')))}[/]")
            return
        tag = f"[dim]a{ln.attempt}│[/] "
        rec = parse_marker(ln.text)
        if rec is not None:
            # the trainer prints its own human line for each step; markers stay quiet
            if rec.get("kind") == "checkpoint":
                self.c.print(f"{tag}[green]checkpoint step {rec.get('step')}[/]")
            elif rec.get("kind") == "done":
                self.c.print(f"{tag}[green]done at step {rec.get('step')}[/]")
            elif rec.get("kind") == "step":
                loss = rec.get("loss")
                if isinstance(loss, float) and loss != loss:
                    self.c.print(f"{tag}[bold red]step {rec.get('step')} loss NaN[/]")
            return
        rule = match_line(ln.text)
        if rule is not None:
            self.c.print(f"{tag}[bold red]{escape(ln.text)}[/]  [red]← {rule.cls}[/]")
        else:
            self.c.print(f"{tag}{escape(ln.text)}")


def _follow(ops, run_id, *, follow, raw, attempt, since, from_attempt) -> int:
    from ..engine.logs import LogFollower
    from ..ops.timespec import parse_since

    err = Console(stderr=True, highlight=False)
    f = LogFollower(ops.t, ops.layout, run_id, on_line=_Printer(raw), follow=follow,
                    attempt=attempt, from_attempt=from_attempt,
                    since=parse_since(since, time.time()),
                    on_reconnect=lambda n, why: err.print(
                        f"[yellow]dfo: connection lost ({escape(why)}); reconnecting ({n})[/]"))
    try:
        status = f.run()
    except KeyboardInterrupt:
        err.print(f"dfo: detached; run {escape(run_id)} goes on (dfo logs -f --run {escape(run_id)})")
        raise click.exceptions.Exit(EXIT_INTERRUPTED)
    if follow:
        if status == "failed":
            info = (ops.status(run_id) or [{}])[0]
            raise RunFailed(f"run {run_id} failed: {info.get('reason')}",
                            hint="see `dfo logs --run " + run_id + "` and docs/recovery.md")
        if status == "lost":
            raise RunFailed(f"run {run_id}: its supervisor is gone (lost)",
                            hint="relaunch with `dfo launch --resume latest`")
        err.print(f"dfo: run {escape(run_id)} {escape(str(status))}")
    return 0


@click.command()
@click.option("--host", "host_name", default=None)
@click.option("-f", "--follow", is_flag=True, help="Keep following; exit with the run's final status.")
@click.option("--run", "run_id", default=None, help="Run id (default: the live run, else the newest).")
@click.option("--attempt", type=int, default=None, help="Only this attempt's log.")
@click.option("--since", default=None, help="Only events newer than this (30s, 10m, 2h, or a unix time).")
@click.option("--raw", is_flag=True, help="Print the files' lines as they are.")
@click.pass_obj
def logs(app, host_name, follow, run_id, attempt, since, raw):
    """Stream a run's events and its current attempt's log (Ctrl-C detaches)."""
    from ..engine.logs import current_attempt

    ops = _ops(app, host_name)
    rid = ops.current_run(run_id)
    start = 1 if follow and attempt is None and since is None else current_attempt(ops, rid)
    return _follow(ops, rid, follow=follow, raw=raw, attempt=attempt, since=since,
                   from_attempt=start)


# --- status / stop -----------------------------------------------------------------------------


def status_table(host: str, runs: list[dict]) -> Table:
    """The rich table of ``dfo status`` (values from state.json are shown as text, never markup)."""
    t = Table(title=Text(f"runs on {host}"))
    t.add_column("run", no_wrap=True)
    t.add_column("state", no_wrap=True)
    for col in ("attempt", "step", "tok/s", "last event", "fallback", "last checkpoint",
                "uptime"):
        t.add_column(col)
    style = {"done": "green", "failed": "red", "lost": "red", "running": "cyan",
             "backoff": "yellow", "stopping": "yellow", "stopped": "dim"}
    for r in runs:
        st = str(r.get("shown_status") or r.get("status") or "?")
        fb = ", ".join(str(f.get("step")) for f in r.get("fallbacks") or [] if isinstance(f, dict)) or "-"
        ck = r.get("last_checkpoint") if isinstance(r.get("last_checkpoint"), dict) else {}
        end = _finite(r.get("ended_at")) or _finite(r.get("now")) or time.time()
        tps = _finite(r.get("tokens_per_s"))
        started = _finite(r.get("started_at"))
        t.add_row(Text(str(r.get("run_id"))), Text(st, style=style.get(st, "")),
                  str(r.get("attempt") or 0),
                  str(r.get("last_step") if r.get("last_step") is not None else "-"),
                  "-" if tps is None else f"{tps:.0f}",
                  Text(str(r.get("last_event") or "-")), Text(fb),
                  f"step_{ck['step']}" if ck.get("step") is not None else "-",
                  "-" if started is None else _age(end - started))
    return t


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
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@click.command()
@click.option("--host", "host_name", default=None)
@click.option("--run", "run_id", default=None)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def status(app, host_name, run_id, as_json):
    """A table of the host's runs: attempt, state, step, tok/s, last event, fallback, checkpoint."""
    ops = _ops(app, host_name)
    runs = ops.status(run_id)
    if as_json:
        click.echo(json.dumps({"host": ops.host.name, "runs": runs}, default=str))
        return 0
    Console(highlight=False).print(status_table(ops.host.name, runs))
    return 0


@click.command()
@click.option("--host", "host_name", default=None)
@click.option("--run", "run_id", default=None)
@click.option("--timeout", type=POSITIVE_SECONDS, default=300.0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def stop(app, host_name, run_id, timeout, as_json):
    """Stop a run: the trainer checkpoints and exits; the run ends `stopped`."""
    ops = _ops(app, host_name)
    info = ops.stop(run_id, timeout=timeout)
    if as_json:
        click.echo(json.dumps(info, default=str))
        return 0
    ck = info.get("last_checkpoint") or {}
    click.echo(f"run {info['run_id']}: {info.get('shown_status') or info.get('status')}"
               + (f", last checkpoint step_{ck['step']}" if ck.get("step") is not None else ""))
    return 0


# --- diagnose ----------------------------------------------------------------------------------

@click.command()
@click.argument("logfile", type=click.Path(dir_okay=False))
@click.option("--exit-code", type=int, default=None, help="The process's exit code, if known.")
@click.option("--config", "config", default=None, type=click.Path(dir_okay=False),
              help="Run config to evaluate the fallback against.")
@click.option("--run-file", default=None, type=click.Path(dir_okay=False),
              help="Your own trainer's run file: its ladder gives the fallback.")
@click.option("--json", "as_json", is_flag=True)
def diagnose(logfile, exit_code, config, run_file, as_json):
    """Classify a saved log offline: class, evidence lines, and the fallback dfo would choose."""
    from ..engine.diagnose import diagnose as run

    res = run(logfile, exit_code=exit_code, config=config, run_file=run_file)
    d, choice = res.diagnosis, res.fallback
    if as_json:
        click.echo(json.dumps(res.to_json()))
        return 0
    c = Console(highlight=False, soft_wrap=True)
    c.print(f"[bold]{d.cls}[/]: {escape(d.reason)}")
    for ev in d.evidence:
        c.print(f"  [red]{ev.line_no:>6}│ {escape(ev.text)}[/]")
    if choice is None:
        c.print("fallback: none (the run finished)")
    elif choice.exhausted:
        c.print("fallback: none left; the run would end failed")
    elif choice.step is None:
        c.print("fallback: restart with the same config (transient)")
    else:
        ch = ", ".join(f"{k}={v}" for k, v in choice.changed.items())
        c.print(f"fallback: [yellow]{choice.step}[/]" + (f" ({escape(ch)})" if ch else "")
                + (" + restore the compile cache" if choice.restore_cache else ""))
    return 0


COMMANDS = [launch, logs, status, stop, diagnose]
