"""``dfo demo``: the README's main job on the chosen host (default: the embedded ``local``).

deploy -> demo assets -> warm-cache -> launch (with one injected FX-tracing failure) -> logs -f.
Click only: each step is the same command a user would type.
"""

from __future__ import annotations

import time

import click

from rich.markup import escape

from ..common.errors import DfoError
from .console import Activity, console, minutes_seconds, stamp
from .params import FAULT_SPEC

from .cache import warm_cache
from .deploy import deploy
from .run import launch


@click.command("demo")
@click.option("--host", "host_name", default=None, metavar="NAME", help="Host from hosts.yaml (default: the default host).")
@click.option("--fault", default=None, metavar="SPEC", type=FAULT_SPEC,
              help="Fault to inject in the first attempt (default: fx_race@30, torch's FX-tracing "
                   "error of the threaded lazy-compile race, docs/recovery.md).")
@click.option("--no-fault", is_flag=True, help="Run without an injected failure.")
@click.pass_context
def demo(ctx: click.Context, host_name: str | None, fault: str | None, no_fault: bool) -> int:
    """Deploy, warm the compile cache, and train a tiny drafter that recovers from the FX error.

    Each step says how long it usually takes when it starts and how long it took when it
    ends; the demo ends with a recap of the run (the failure, its fallback, the checkpoint
    resumed, the time lost, the acceptance length) and the commands to try next."""
    from ..engine.demo import DEMO_FAULT, EXPECT, ensure_assets

    app = ctx.obj
    con = console(stderr=True)
    host = app.host(host_name)
    t_all = time.monotonic()

    def step(n: int, what: str, expect: str) -> float:
        if con.is_terminal:
            con.rule(f"[bold]{n}/4 {escape(what)}[/bold] on {escape(host.name)}")
        else:  # a pipe: one plain, timestamped line (a rule would be as wide as the console)
            con.print(f"{stamp()} == {n}/4 {what} on {host.name}", markup=False)
        con.print(f"{'' if con.is_terminal else stamp() + ' '}dfo: expect: {expect}",
                  markup=False, highlight=False)
        return time.monotonic()

    def took(n: int, what: str, t0: float) -> None:
        con.print(f"{stamp()} {n}/4 {what}: took {minutes_seconds(time.monotonic() - t0)}",
                  markup=False, highlight=False)

    t0 = step(1, "dfo deploy", EXPECT["deploy"])
    _run(ctx, deploy, ["--host", host.name])
    took(1, "dfo deploy", t0)

    t0 = step(2, "demo assets (tiny Qwen3 target, synthetic data)", EXPECT["assets"])
    with Activity("demo assets", con=con) as act:   # a spinner, or steady lines in a pipe
        def say(m: str) -> None:
            act.line(f"dfo: {escape(m)}")
            act.update(m.split(" (")[0])

        ensure_assets(app.transport(host.name), host.tree, say=say)
    took(2, "demo assets", t0)

    t0 = step(3, "dfo warm-cache", EXPECT["warm-cache"])   # the default run config is the demo's
    _run(ctx, warm_cache, ["--host", host.name, "--no-check"])
    took(3, "dfo warm-cache", t0)

    t0 = step(4, "dfo launch -f", EXPECT["launch"])
    spec = None if no_fault else (fault or DEMO_FAULT)
    if spec:
        con.print(f"dfo: injecting [bold]{spec}[/bold]: torch will raise the FX-tracing error in "
                  "attempt 1; watch the supervisor classify it and fall back")
    rc = _run(ctx, launch, launch_args(host.name, spec))
    took(4, "dfo launch -f", t0)
    try:
        print_recap(app, host.name, time.monotonic() - t_all)
    except DfoError as e:   # the run is over either way: its exit code stands
        con.print(f"dfo: no recap: {e}", markup=False, highlight=False)
    return rc


def print_recap(app, host_name: str, total_s: float) -> None:
    """The demo's last words, on stdout: what happened in the run it launched (plan.recap, from
    the run's events) and the commands to try next."""
    from ..engine.demo import run_events
    from ..plan.recap import recap
    from .run_ops import open_run_ops

    run_ops = open_run_ops(app, host_name)
    run_id = run_ops.current_run()
    rec = recap(run_events(run_ops.transport, run_ops.tree, run_id))
    out = console()
    if out.is_terminal:
        out.rule(f"[bold]what happened[/bold] in {escape(run_id)}")
    else:
        out.print(f"== what happened in {run_id}", markup=False)
    for ln in rec.lines() + [f"the demo took {minutes_seconds(total_s)} in all"]:
        out.print(f"  {ln}", markup=False, highlight=False)
    out.print("next, try:", markup=False)
    for cmd, what in next_commands(host_name):
        out.print(f"  {cmd}\n      {what}", markup=False, highlight=False)


def next_commands(host_name: str) -> list[tuple[str, str]]:
    """What to try after the demo (the README's commands, as they work on its run)."""
    from ..engine.wheel import install_extra_hint

    h = "" if host_name == "local" else f" --host {host_name}"
    dfo = dfo_as_typed()
    try:
        import matplotlib  # noqa: F401
        plot = "its curves as a PNG"
    except ImportError:
        plot = f"its curves as a PNG (needs matplotlib: {install_extra_hint('plot')})"
    return [(f"{dfo} status{h}", "the run's state and goodput (--json: the time lost per cause too)"),
            (f"{dfo} plot{h}", plot),
            (f"{dfo} export{h} --to DIR", "the drafter (its newest checkpoint) for vLLM or SGLang"),
            (f"{dfo} launch{h} --resume step_200 --set train.max_steps=300 -f",
             "train 100 steps more")]


def dfo_as_typed() -> str:
    """How to type this dfo in a new shell: ``dfo`` when the one PATH finds is this one
    (scripts/demo.sh links it), else its full path."""
    import os
    import shutil
    import sys

    own = os.path.join(sys.prefix, "bin", "dfo")
    found = shutil.which("dfo")
    if found and os.path.exists(own) and os.path.samefile(found, own):
        return "dfo"
    return own if os.path.exists(own) else "dfo"


def launch_args(host: str, fault: str | None) -> list[str]:
    """The demo's `dfo launch` arguments: the defaults (the demo's config, run name `demo`;
    the run id adds the start time once); --new-lineage: a new demo starts over, an earlier
    demo's checkpoints move aside under a dated name instead of being resumed."""
    args = ["--host", host, "--new-lineage", "--replace", "--follow", "--backoff-scale", "0.02"]
    return args + (["--fault", fault] if fault else [])


def _run(ctx: click.Context, cmd: click.Command, args: list[str]):
    """Run another dfo command exactly as if typed (its own parsing and defaults)."""
    with cmd.make_context(cmd.name, args, parent=ctx) as sub:
        return cmd.invoke(sub)


COMMANDS = [demo]
