"""``dfo plot`` and ``dfo tensorboard``: pictures of a run. Click only."""

from __future__ import annotations


import click

from .run_ops import open_run_ops


@click.command()
@click.option("--host", "host_name", default=None, help="Host from hosts.yaml (default: the default host).")
@click.option("--run", "run", default=None, help="Run id (default: the live run, else the newest).")
@click.option("--out", "out", default=None, type=click.Path(dir_okay=False),
              help="PNG to write (default: ./<run-id>.png).")
@click.pass_obj
def plot(app, host_name, run, out):
    """Draw a run's loss, acceptance and throughput against step into a PNG, with attempt
    boundaries and the fallback applied at each."""
    from ..engine import plot as pl

    c = pl.fetch_curves(open_run_ops(app, host_name), run)
    path = pl.render(c, out or pl.default_path(c.run_id))
    click.echo(path)
    return 0


@click.command()
@click.option("--host", "host_name", default=None, help="Host from hosts.yaml (default: the default host).")
@click.option("--run", "run", default=None, help="Run id (default: the live run, else the newest).")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Local port of the URL (default: 6006, else a free one).")
@click.option("--python", "python", default=None, metavar="PATH",
              help="Interpreter on the host that has tensorboard (default: the deployed env's).")
@click.pass_obj
def tensorboard(app, host_name, run, port, python):
    """Start TensorBoard on a run's event files on the host and forward it to this machine's
    loopback (over the SSH connection). Ctrl-C stops it."""
    from ..engine import tensorboard as tbe

    tb = tbe.TensorBoard(open_run_ops(app, host_name), run, port=port, python=python)
    url = tb.start()
    click.echo(f"TensorBoard for {tb.run_id}: {url}  (Ctrl-C stops it)")
    try:
        info = tbe.run_until_interrupted(tb)
    except KeyboardInterrupt:
        click.echo("dfo: tensorboard stopped", err=True)
        return 0
    click.echo(f"dfo: tensorboard exited ({info.exit})", err=True)
    return 0


COMMANDS = [plot, tensorboard]
