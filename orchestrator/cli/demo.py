"""``dfo demo``: the README's main job on the chosen host (default: the embedded ``local``).

deploy -> demo assets -> warm-cache -> launch (with one injected FX-tracing failure) -> logs -f.
Click only: each step is the same command a user would type.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import click
from rich.console import Console

from .cache import warm_cache
from .deploy import deploy
from .run import launch


@click.command("demo")
@click.option("--host", "host_name", default=None, help="Host from hosts.yaml (default: the default host).")
@click.option("--fault", default=None, metavar="SPEC",
              help="Fault to inject in the first attempt (default: fx_race@30, the incident's error).")
@click.option("--no-fault", is_flag=True, help="Run without an injected failure.")
@click.pass_context
def demo(ctx: click.Context, host_name: str | None, fault: str | None, no_fault: bool) -> int:
    """Deploy, warm the compile cache, and train a tiny drafter that recovers from the FX error."""
    from ..demo import DEMO_FAULT, ensure_assets, write_demo_config

    app = ctx.obj
    con = Console(stderr=True)
    host = app.host(host_name)

    def step(n: int, what: str) -> None:
        con.rule(f"[bold]{n}/4 {what}[/bold] on {host.name}")

    step(1, "dfo deploy")
    ctx.invoke(deploy, host_name=host.name, check=False, rollback=False, force=False,
               profile=None, as_json=False)

    step(2, "demo assets (tiny Qwen3 target, synthetic data)")
    ensure_assets(app.transport(host.name), host.layout, say=lambda m: con.print(f"dfo: {m}"))
    cfg_dir = Path(tempfile.mkdtemp(prefix="dfo-demo-"))
    cfg = write_demo_config(host.layout, cfg_dir / "demo.yaml")

    step(3, "dfo warm-cache")
    wc_params = {p.name: p.get_default(ctx) for p in warm_cache.params}
    wc_params.update(host_name=host.name, config_path=str(cfg))
    ctx.invoke(warm_cache, **wc_params)

    step(4, "dfo launch -f")
    spec = None if no_fault else (fault or DEMO_FAULT)
    if spec:
        con.print(f"dfo: injecting [bold]{spec}[/bold]: torch will raise the FX-tracing error in "
                  "attempt 1; watch the supervisor classify it and fall back")
    l_params = {p.name: p.get_default(ctx) for p in launch.params}
    l_params.update(host_name=host.name, config=str(cfg), run_name="demo", replace=True,
                    follow=True, fault=spec, backoff_scale=0.02)
    return ctx.invoke(launch, **l_params)


COMMANDS = [demo]
