"""``dfo launch``, ``dfo logs``, ``dfo status``, ``dfo stop``, ``dfo diagnose``: click only."""

from __future__ import annotations

import json
import shlex
import time
import click

from rich.markup import escape

from ..common.errors import EXIT_INTERRUPTED, ConfigError, NotFoundError, RunFailed
from .console import Activity, console, note, print_launch
from .group_run import GROUP_OPTION, follow_group_logs, group_runs, launch_group
from .log_lines import JsonLinePrinter, LinePrinter, skipped_note
from .params import (BUDGET, FAULT_SPEC, LADDER, NON_NEGATIVE, THRESHOLD, as_budget, as_ladders,
                     as_thresholds)
from .run_ops import open_run_ops, require_run


# --- launch ----------------------------------------------------------------------------------

class _LaunchCommand(click.Command):
    """``dfo launch``, noting whether the line had a ``--`` (your own command follows it)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["dfo.dash_dash"] = "--" in args
        return super().parse_args(ctx, args)


@click.command(cls=_LaunchCommand)
@click.option("--host", "host_name", default=None, metavar="NAME", help="Host from hosts.yaml (default: the default host).")
@click.option("--resume", default=None, metavar="step_N|latest|PATH",
              help="Checkpoint to start from: a name, 'latest', or a path under the host's root.")
@click.option("--config", "config", default=None, type=click.Path(dir_okay=False),
              help="Run config (trainer YAML); default: the demo's (the shipped tiny-cpu.yaml with "
                   "compile on and its target and data where `dfo demo` puts them on the host, "
                   "<root>/demo/).")
@click.option("--run-name", default=None, metavar="NAME",
              help="Run name (checkpoints/<run-name>/; the run id adds the start time); "
                   "default: the config file's stem; without --config: demo.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Config override, e.g. --set train.micro_batch=4 (repeatable).")
@click.option("--replace", is_flag=True, help="Stop the host's live run first.")
@click.option("--new-lineage", is_flag=True,
              help="Start over in a run name that has checkpoints: move them aside under a dated name.")
@click.option("--dry-run", is_flag=True, help="Validate and print the plan; start nothing.")
@click.option("-f", "--follow", is_flag=True, help="Then follow the logs (like dfo logs -f).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--fault", default=None, metavar="SPEC", type=FAULT_SPEC,
              help="Fault injection for tests/demos (DFO_FAULT), e.g. fx_race@5.")
@click.option("--fault-node", type=click.IntRange(min=0), default=None, metavar="K",
              help="With --group: inject --fault on node K only (default: every node).")
@click.option("--backoff-scale", type=NON_NEGATIVE, default=1.0, show_default=True,
              help="Multiply restart backoffs (0.01 for demos and tests).")
@click.option("--threshold", "thresholds", multiple=True, metavar="NAME=SECONDS", type=THRESHOLD,
              callback=as_thresholds,
              help="Watchdog thresholds: warmup_s, train_s, stop_timeout_s, kill_grace_s, ...")
@click.option("--budget", "budget", multiple=True, metavar="CLASS=N", type=BUDGET,
              callback=as_budget,
              help="Restart budget per class (or total=N, startup_limit=N).")
@click.option("--fallbacks", "fallbacks", multiple=True, metavar="CLASS=STEP,STEP", type=LADDER,
              callback=as_ladders,
              help="Replace a class's fallback ladder, e.g. oom=halve_micro_batch*.")
@click.option("--no-env-check", is_flag=True, help="Skip `dfo deploy --check` (development only).")
@click.option("--no-standby", is_flag=True,
              help="No standby interpreter (pre-imported next attempt); docs/recovery.md.")
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
@GROUP_OPTION
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def launch(app, host_name, group_name, resume, config, run_name, sets, replace, new_lineage, dry_run, follow,
           as_json, fault, fault_node, backoff_scale, thresholds, budget, fallbacks, no_env_check,
           no_standby, run_file, step_pattern, resume_glob, resume_order, resume_args, ladder, command):
    """Start a supervised training run on a host, detached (it outlives this command).

    With `-- CMD ARGS...` it supervises your own training command instead of the bundled
    trainer (docs/own-trainer.md)."""
    from ..engine.runs import LaunchOptions

    if not command and run_file is None and click.get_current_context().meta.get("dfo.dash_dash"):
        raise ConfigError("dfo launch --: no command after `--`",
                          hint="give your trainer's command after it (dfo launch -- python "
                               "train.py ...), or drop `--` to launch the bundled trainer")
    if fault_node is not None and (group_name is None or fault is None):
        raise ConfigError("--fault-node needs --group and --fault",
                          hint="give --group NAME --fault SPEC, or drop --fault-node")

    opts = LaunchOptions(config=config, resume=resume, run_name=run_name, sets=sets,
                         replace=replace, dry_run=dry_run, fault=fault, fault_node=fault_node,
                         backoff_scale=backoff_scale, thresholds=thresholds,
                         budget=budget, fallbacks=fallbacks, env_check=not no_env_check,
                         new_lineage=new_lineage, command=tuple(command), run_file=run_file,
                         step_pattern=step_pattern, resume_glob=resume_glob,
                         resume_order=resume_order, resume_args=resume_args or (),
                         ladder=tuple(ladder), standby=not no_standby)
    if group_name is not None:
        return launch_group(app, group_name, host_name, opts, as_json=as_json,
                             follow=follow)
    with Activity("launch", enabled=not as_json) as act:
        run_ops = open_run_ops(app, host_name, say=lambda m: act.line(f"dfo: {escape(m)}"))
        act.update("checking the host, the env and the config" + ("" if dry_run else
                                                                   "; then starting the run"))
        plan = run_ops.launch(opts)
    run_ops.say = note
    if as_json:
        d = plan.to_json()
        d["started"] = not dry_run
        click.echo(json.dumps(d))
    else:
        _print_plan(plan, dry_run)
    if follow and not dry_run:
        return _follow(run_ops, plan.run_id, follow=True, raw=False, attempt=None, since=None,
                       from_attempt=1)
    return 0


def _print_plan(plan, dry_run: bool) -> None:
    from ..common.fallback import describe

    b = plan.spec.budget
    rows = [f"  run dir      {escape(plan.run_dir)}",
            f"  resume       {escape(plan.resume_path or 'from scratch')}",
            f"  start        {escape(shlex.join(plan.start_argv))}",
            f"  attempt 1    {escape(shlex.join(plan.first_attempt_argv))}",
            "  env",
            *(f"    {escape(k)}={escape(v)}" for k, v in sorted(plan.env.items())),
            "  fallback ladders (class: steps; restart budget)",
            *(f"    {cls:<15} {escape(steps)}; {b.per_class.get(cls, '-')}"
              for cls, steps in describe(plan.shown_ladders)),
            f"  budget total {b.total}, backoff {b.initial}s x{b.factor} "
            f"cap {b.cap}s (scale {b.scale}), reset after {b.healthy_reset}s healthy"]
    print_launch(plan.warnings, dry_run=dry_run, rows=rows,
                 launched=f"[green]launched[/] {escape(plan.run_id)} on {escape(plan.host)} "
                          f"({plan.mode}); follow with: dfo logs -f --run {escape(plan.run_id)}",
                 title=f"[bold]plan[/] run {escape(plan.run_id)} on {escape(plan.host)} ({plan.mode})")


# --- logs ------------------------------------------------------------------------------------

def _follow(run_ops, run_id, *, follow, raw, attempt, since, from_attempt,
            as_json: bool = False) -> int:
    from ..engine.logs import LogFollower
    from ..plan.timespec import parse_since

    err = console(stderr=True)
    printer = JsonLinePrinter() if as_json else LinePrinter(raw)
    f = LogFollower(run_ops.transport, run_ops.tree, run_id, on_line=printer, follow=follow,
                    attempt=attempt, from_attempt=from_attempt,
                    since=parse_since(since, time.time()),
                    on_reconnect=lambda n, why: err.print(
                        f"[yellow]dfo: connection lost ({escape(why)}); reconnecting ({n})[/]"),
                    on_skipped=lambda n: err.print(f"[yellow]{escape(skipped_note(n))}[/]"))
    try:
        if isinstance(printer, LinePrinter):
            with printer.beat(follow):
                status = f.run()
        else:
            status = f.run()
    except KeyboardInterrupt:
        err.print(f"dfo: detached; run {escape(run_id)} goes on (dfo logs -f --run {escape(run_id)})")
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
    if follow:
        if status == "failed":
            runs = run_ops.status(run_id)
            raise RunFailed(f"run {run_id} failed: {runs[0].state.reason if runs else None}",
                            hint="see `dfo logs --run " + run_id + "` and docs/recovery.md")
        if status == "lost":
            raise RunFailed(f"run {run_id}: its supervisor is gone (lost)",
                            hint="relaunch with `dfo launch --resume latest`")
        err.print(f"dfo: run {escape(run_id)} {escape(str(status))}")
    return 0


@click.command()
@click.option("--host", "host_name", default=None, metavar="NAME", help="Host from hosts.yaml (default: the default host).")
@click.option("-f", "--follow", is_flag=True, help="Keep following; exit with the run's final status.")
@click.option("--run", "run_id", default=None, metavar="ID", help="Run id (default: the live run, else the newest).")
@click.option("--attempt", type=int, default=None, help="Only this attempt's log.")
@click.option("--since", default=None, metavar="WHEN", help="Only events newer than this (30s, 10m, 2h, or a unix time).")
@click.option("--raw", is_flag=True, help="Print the files' lines as they are.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per line: file, offset, attempt, text, and an event's "
                   "record (for scripts).")
@GROUP_OPTION
@click.pass_obj
def logs(app, host_name, follow, run_id, attempt, since, raw, as_json, group_name):
    """Stream a run's events and its current attempt's log (Ctrl-C detaches).

    With --group, every node's lines, each prefixed with its host (--json: a `host` key)."""
    if raw and as_json:
        raise ConfigError("--raw and --json together", hint="give one of them")
    from ..engine.logs import current_attempt

    if group_name is not None:
        gr = group_runs(app, group_name, host_name)
        rid = gr.resolve_run(run_id)
        start = 1 if follow and attempt is None and since is None else \
            current_attempt(gr.run_ops(gr.group.head), rid)
        return follow_group_logs(gr, rid, follow=follow, raw=raw, attempt=attempt, since=since,
                                 from_attempt=start, as_json=as_json)
    run_ops = open_run_ops(app, host_name)
    rid = run_ops.current_run(run_id)
    runs = run_ops.status(rid)
    require_run(run_ops, rid, runs)
    if attempt is not None:
        have = [a.n for a in runs[0].state.attempts]
        if attempt not in have:
            raise NotFoundError(f"run {rid} has no attempt {attempt}",
                                hint=("attempts: " + ", ".join(str(n) for n in have)) if have
                                else "it has not started an attempt yet")
    start = 1 if follow and attempt is None and since is None else current_attempt(run_ops, rid)
    return _follow(run_ops, rid, follow=follow, raw=raw, attempt=attempt, since=since,
                   from_attempt=start, as_json=as_json)


# --- diagnose ----------------------------------------------------------------------------------

@click.command()
@click.argument("logfile", type=click.Path(dir_okay=False))
@click.option("--exit-code", type=int, default=None, help="The process's exit code, if known.")
@click.option("--config", "config", default=None, type=click.Path(dir_okay=False),
              help="Run config to evaluate the fallback against.")
@click.option("--run-file", default=None, type=click.Path(dir_okay=False),
              help="Your own trainer's run file: its ladder gives the fallback.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts).")
def diagnose(logfile, exit_code, config, run_file, as_json):
    """Classify a saved log offline: class, evidence lines, and the fallback dfo would choose.

    A log inside its run directory (runs/<id>/attempt-<n>.log) gets the supervisor's answer:
    its class for that attempt and the fallback over the run's own config and ladders. A log
    alone says what it assumed and what it cannot know (a crash or a hang)."""
    from ..engine.diagnose import diagnose as run

    res = run(logfile, exit_code=exit_code, config=config, run_file=run_file)
    d, choice, r = res.diagnosis, res.fallback, res.run
    if as_json:
        click.echo(json.dumps(res.to_json()))
        return 0
    c = console()
    if r is not None and r.cls:
        c.print(f"[bold]{res.cls}[/]: {escape(r.reason or '')} (the supervisor's class for "
                f"attempt {r.attempt} of run {r.run_id})")
        if d.cls != r.cls:
            c.print(f"log alone: {d.cls}: {escape(d.reason)}")
    else:
        c.print(f"[bold]{d.cls}[/]: {escape(d.reason)}")
    for ev in d.evidence:
        c.print(f"  [red]{ev.line if ev.line is not None else '':>6}│ {escape(ev.text)}[/]")
    if res.unknown:
        c.print(f"cannot know: {escape(res.unknown)}")
    if r is not None:
        c.print(f"run: {r.run_id} attempt {r.attempt} (its config, ladders and earlier "
                "fallbacks: spec.json, events.jsonl)")
    elif res.assumed:
        c.print(f"assumed: {escape(res.assumed)}")
    if res.alternatives:
        c.print("fallback: depends on how it ended: " + "; ".join(
            f"{k} -> {_fallback_text(v)}" for k, v in res.alternatives.items()))
    elif choice is None:
        c.print("fallback: none (the run finished)")
    else:
        c.print("fallback: " + _fallback_text(choice, rich=True))
    if r is not None and r.gave_up:
        c.print(f"the supervisor gave up: {escape(r.gave_up)}")
    elif r is not None and r.applied is not None:
        c.print(f"the supervisor applied: {r.applied or 'restart unchanged'}")
    return 0


def _fallback_text(choice, rich: bool = False) -> str:
    if choice.exhausted:
        return "none left; the run would end failed"
    if choice.step is None:
        return choice.note or "restart with the same config (transient)"
    ch = ", ".join(f"{k}={v}" for k, v in choice.changed.items())
    step = f"[yellow]{choice.step}[/]" if rich else choice.step
    return (step + (f" ({escape(ch)})" if ch else "")
            + (" + restore the compile cache" if choice.restore_cache else ""))


COMMANDS = [launch, logs, diagnose]
