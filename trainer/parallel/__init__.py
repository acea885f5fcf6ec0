"""Layouts for the trainer (docs/trainer.md, "Layouts"): who holds the models, how a step runs.

- ``single`` (trainer.parallel.single): one device, micro-batches sequential.
- ``threads`` (trainer.parallel.threads): one process, a worker thread per device.
- ``ddp`` (trainer.parallel.ddp): one process per GPU under torchrun.

Every layout implements the ``Layout`` protocol (trainer.parallel.base) in full;
``make_layout(cfg, rt)`` is the dispatch point the loop calls.
"""

from __future__ import annotations

from dfo_contract.exitcodes import TrainerConfigError

from .base import Layout, LayoutBase

LAYOUTS = ("single", "threads", "ddp")
__all__ = ["LAYOUTS", "Layout", "LayoutBase", "make_layout"]


def make_layout(cfg, rt=None) -> Layout:
    """The layout ``parallel.layout`` names; ``rt``: the process's
    ``trainer.core.runtime.Runtime`` (its compile registry, its ``env``: ddp reads torchrun's
    ranks from it; None: the layout makes its own)."""
    layout = cfg.parallel.layout
    if layout == "single":
        from .single import SingleLayout

        return SingleLayout(cfg, rt)
    if layout == "threads":
        from .threads import ThreadsLayout

        return ThreadsLayout(cfg, rt)
    if layout == "ddp":
        from .ddp import DdpLayout

        return DdpLayout(cfg, rt)
    raise TrainerConfigError(f"config: --parallel.layout: {layout!r} is not a layout "
                             f"(expected one of {', '.join(LAYOUTS)})")
