"""``dfo demo``: the README's main job on the chosen host (default: the embedded ``local``).

deploy -> demo assets -> warm-cache -> launch (with one injected FX-tracing failure) -> logs -f.
Click only: each step is the same command a user would type.
"""

from __future__ import annotations

import click

from rich.markup import escape

from .console import Activity, console, stamp
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
    """Deploy, warm the compile cache, and train a tiny drafter that recovers from the FX error."""
    from ..engine.demo import DEMO_FAULT, ensure_assets

    app = ctx.obj
    con = console(stderr=True)
    host = app.host(host_name)

    def step(n: int, what: str) -> None:
        if con.is_terminal:
            con.rule(f"[bold]{n}/4 {what}[/bold] on {host.name}")
        else:  # a pipe: one plain, timestamped line (a rule would be as wide as the console)
            con.print(f"{stamp()} == {n}/4 {what} on {host.name}", markup=False)

    step(1, "dfo deploy")
    _run(ctx, deploy, ["--host", host.name])

    step(2, "demo assets (tiny Qwen3 target, synthetic data)")
    with Activity("demo assets", con=con) as act:   # a spinner, or steady lines in a pipe
        def say(m: str) -> None:
            act.line(f"dfo: {escape(m)}")
            act.update(m.split(" (")[0])

        ensure_assets(app.transport(host.name), host.layout, say=say)

    step(3, "dfo warm-cache")   # the default run config is the demo's
    _run(ctx, warm_cache, ["--host", host.name, "--no-check"])

    step(4, "dfo launch -f")
    spec = None if no_fault else (fault or DEMO_FAULT)
    if spec:
        con.print(f"dfo: injecting [bold]{spec}[/bold]: torch will raise the FX-tracing error in "
                  "attempt 1; watch the supervisor classify it and fall back")
    return _run(ctx, launch, launch_args(host.name, spec))


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
