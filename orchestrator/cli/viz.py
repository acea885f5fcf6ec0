"""``dfo plot`` and ``dfo tensorboard``: pictures of a run. Click only."""

from __future__ import annotations


import click

from .run import _ops


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

    c = pl.fetch_curves(_ops(app, host_name), run)
    path = pl.render(c, out or pl.default_path(c.run_id))
    click.echo(path)
    return 0


COMMANDS = [plot]
