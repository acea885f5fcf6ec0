"""``dfo plot``: fetch a run's metrics.jsonl and events.jsonl, draw its curves into a PNG.

The curves come from ``plan.curves`` (pure); this module reads the two files through the
transport (one ``get`` each) and draws with matplotlib's Agg backend on this machine
(the container needs nothing). matplotlib is the ``plot`` extra of dfo.
"""

from __future__ import annotations

import logging
import os

from dfo_contract import runstate as rs
from dfo_contract.errors import ContractError
from dfo_contract.metrics_record import METRICS_FILE

from ..common.errors import ConfigError, ContractMismatch, NotFoundError
from ..plan import curves as cv

log = logging.getLogger("dfo")

WIDTH_PX, HEIGHT_PX, DPI = 1200, 900, 100
MAX_NOTES = 8  # attempt notes under the plot; more are summarized


def fetch_curves(run_ops, run: str | None) -> cv.Curves:
    """The curves of ``run`` (default: the live run, else the newest) on ``ops``'s host."""
    run_id = run_ops.current_run(run)
    run_dir = run_ops.tree.run_dir(run_id)
    try:
        events = run_ops.transport.get(f"{run_dir}/{rs.EVENTS_FILE}").decode("utf-8", "replace")
    except NotFoundError:
        raise NotFoundError(f"no run {run_id} on {run_ops.host.name}",
                            hint="see `dfo status` for run ids") from None
    try:
        metrics = run_ops.transport.get(f"{run_dir}/{METRICS_FILE}").decode("utf-8", "replace")
    except NotFoundError:
        metrics = ""
    try:
        c = cv.curves(run_id, metrics, events)
    except ContractError as e:
        raise ContractMismatch(f"run {run_id}: {rs.EVENTS_FILE}: {e}") from None
    if c.empty:
        raise NotFoundError(f"run {run_id} has logged no step yet ({run_dir}/{METRICS_FILE})",
                            hint="plot again after its first log step (train.log_every)")
    return c


def default_path(run_id: str) -> str:
    return os.path.abspath(f"{run_id}.png")


def render(c: cv.Curves, out: str) -> str:
    """Draw ``c`` into the PNG ``out`` (WIDTH_PX x HEIGHT_PX); returns its absolute path."""
    try:
        import matplotlib
    except ImportError:
        from .wheel import install_extra_hint

        raise ConfigError("dfo plot needs matplotlib on this machine",
                          hint=f"install it with `{install_extra_hint('plot')}`") from None
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI)
    axes = fig.subplots(len(c.panels), 1, sharex=True)
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, series) in zip(axes, c.panels, strict=True):
        names = list(dict.fromkeys(s.name for s in series))
        for s in series:
            color = colors[names.index(s.name) % len(colors)]
            first = s.attempt == min(x.attempt for x in series if x.name == s.name)
            ax.plot(s.steps, s.values, color=color, linewidth=1.2,
                    marker="." if len(s.steps) < 40 else None,
                    label=s.name if first else None)
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        if len(names) > 1:
            ax.legend(loc="best", fontsize=8)
        for b in c.boundaries:
            if b.step is not None:
                ax.axvline(b.step, color="0.4", linestyle="--", linewidth=0.9)
    from matplotlib.ticker import MaxNLocator

    for b in c.boundaries:
        if b.step is not None:
            axes[0].annotate(str(b.attempt), xy=(b.step, 1.0), xycoords=("data", "axes fraction"),
                             xytext=(2, 2), textcoords="offset points", fontsize=8, color="0.25")
    axes[-1].set_xlabel("step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"{c.run_id}" + (f" ({c.status})" if c.status else ""))
    notes = [f"{b.label}" + (f" (from step {b.step})" if b.step is not None else "")
             for b in c.boundaries]
    if len(notes) > MAX_NOTES:
        notes = notes[:MAX_NOTES - 1] + [f"... and {len(notes) - MAX_NOTES + 1} more attempts"]
    bottom = (0.06 + 0.022 * len(notes)) if notes else 0.06
    fig.subplots_adjust(left=0.08, right=0.98, top=0.94, bottom=bottom, hspace=0.25)
    for i, text in enumerate(notes):
        fig.text(0.08, 0.012 + 0.022 * (len(notes) - 1 - i), text, fontsize=8, color="0.25")
    path = os.path.abspath(out)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        fig.savefig(tmp, format="png", dpi=DPI)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ConfigError(f"cannot write {path}: {e.strerror}",
                       hint="pass --out with a writable path") from None
    log.info("wrote %s", path)
    return path
