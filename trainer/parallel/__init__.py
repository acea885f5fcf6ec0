"""Multi-device layouts for the trainer (docs/trainer.md, "Layouts").

``make_layout(cfg)`` is called by ``trainer.loop.make_layout`` for every layout but
``single``:

- ``threads`` (trainer.parallel.threads): one process, a worker thread per device.
- ``ddp`` (trainer.parallel.ddp): one process per GPU under torchrun.

Both follow the loop's layout protocol (see trainer/loop.py) plus two optional hooks the
loop calls when present: ``after_step()`` (after the optimizer step) and ``before_save()``
(before a checkpoint is written).
"""

from __future__ import annotations

from dfo_contract.exitcodes import TrainerConfigError

LAYOUTS = ("threads", "ddp")


def make_layout(cfg):
    layout = cfg.parallel.layout
    if layout == "threads":
        from .threads import ThreadsLayout

        return ThreadsLayout(cfg)
    if layout == "ddp":
        from .ddp import DdpLayout

        return DdpLayout(cfg)
    raise TrainerConfigError(f"config: --parallel.layout: {layout!r} is not a multi-device layout "
                             f"(expected one of {', '.join(LAYOUTS)})")
