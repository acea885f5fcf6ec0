"""One host's run commands, as the CLI opens them: the host's ``RunOps`` and the exit-11
answer for an unknown ``--run`` (shared by launch, logs, status, stop, plot, tensorboard)."""

from __future__ import annotations

from dfo_contract.status import RunStatus

from ..common.errors import NotFoundError
from .console import note


def open_run_ops(app, host_name, say=None):
    """The ``RunOps`` of ``--host NAME`` (default: the default host); ``say`` prints notes."""
    from ..engine.runs import RunOps

    host = app.host(host_name)
    return RunOps(app.transport(host_name), host,
                  say=say or note)


def require_run(run_ops, run_id: str | None, runs: list[RunStatus]) -> None:
    """An unknown ``--run`` is exit 11, naming the runs that exist."""
    if run_id and not runs:
        have = sorted(str(r.run_id) for r in run_ops.status(None))
        raise NotFoundError(f"no run {run_id} on {run_ops.host.name}",
                            hint=("runs: " + ", ".join(have[-10:])) if have
                            else "there are no runs; start one with `dfo launch`")
