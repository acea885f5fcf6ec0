"""``dfo export``: a run's checkpoint as a servable DFlash drafter on this machine (click only)."""

from __future__ import annotations

import json

import click

from .console import note


@click.command("export")
@click.option("--host", "host_name", default=None, help="Host from hosts.yaml (default: the default host).")
@click.option("--run", "run", default=None, help="Run id (default: the live run, else the newest).")
@click.option("--step", "step", default=None, metavar="N|best|latest",
              help="Checkpoint: step N, best (highest measured acceptance length), or latest (default).")
@click.option("--to", "to", required=True, type=click.Path(file_okay=False),
              help="Local directory to write the export to (replaced atomically).")
@click.option("--dtype", default="bf16", show_default=True, type=click.Choice(["bf16", "fp16", "fp32"]))
@click.option("--engines", default="all", show_default=True, metavar="LIST",
              help="Engines that must serve every draft layer as it was trained, comma "
                   "separated (z-lab,vllm,vllm-0.27,sglang,lmdeploy,llama.cpp); the export is "
                   "refused otherwise.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def export(ctx: click.Context, host_name, run, step, to, dtype, engines, as_json) -> int:
    """Export a checkpoint (z-lab/SGLang DFlash layout) and copy it here, sha256-verified."""
    from ..engine.export import ExportOps

    app = ctx.obj
    say = (lambda m: None) if as_json else note

    def progress(name: str, done: int, total: int) -> None:
        if not as_json:
            pct = 100.0 * done / total if total else 100.0
            click.echo(f"dfo: {name} verified ({done}/{total} bytes, {pct:.0f}%)", err=True)

    export_ops = ExportOps(app.transport(host_name), app.host(host_name), say=say)
    res = export_ops.export(to, run=run, step=step, dtype=dtype, progress=progress, engines=engines)
    if as_json:
        click.echo(json.dumps(res.to_json()))
    else:
        al = f", measured acceptance length {res.accept_len:.3f}" if res.accept_len else ""
        click.echo(f"exported step {res.step} of {res.run_id} to {res.local_dir}{al}")
        if res.target_precision == "fp8":
            click.echo("trained on the fp8 target's features (model.target_fp8); engines serve "
                       "it on the full-precision target")
    return 0


COMMANDS = [export]
