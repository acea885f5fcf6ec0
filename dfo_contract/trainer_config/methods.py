"""Validation of ``model.method`` and the DFlash2 fields (``model.conv_*``, ``model.selector_*``,
``model.final_logit_softcapping``, ``model.output_multiplier``,
``train.selector_loss_alpha``). Torch-free; checks needing the target's shape (the conv group
dividing the hidden size, top-k within the vocabulary) are made when the drafter is built.
"""

from __future__ import annotations

import math

from .schema import METHODS


def validate_method(cfg, err) -> None:
    """Raise ``err(flag, why)`` for the first bad method field (DFlash2 fields only when used)."""
    m = cfg.model
    if m.method not in METHODS:
        raise err("model.method", f"expected one of {', '.join(METHODS)}, got {m.method!r}")
    if m.method != "dflash2":
        return
    for name in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        v = getattr(m, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise err(f"model.{name}", f"expected a positive integer, got {v!r}")
    if m.conv_kernel_size > m.block_size:
        raise err("model.conv_kernel_size", f"must be <= model.block_size ({m.block_size}), "
                                            f"got {m.conv_kernel_size}")
    if not (math.isfinite(m.final_logit_softcapping) and m.final_logit_softcapping > 0):
        raise err("model.final_logit_softcapping",
                  f"expected a positive number, got {m.final_logit_softcapping}")
    if not (math.isfinite(m.output_multiplier) and m.output_multiplier > 0):
        raise err("model.output_multiplier", f"expected a positive number, got {m.output_multiplier}")
    a = cfg.train.selector_loss_alpha
    if not (math.isfinite(a) and a >= 0):
        raise err("train.selector_loss_alpha", f"expected a finite number >= 0, got {a}")
    t = cfg.train
    for name in ("selector_warmup_ratio", "selector_ramp_ratio"):
        v = getattr(t, name)
        if not (math.isfinite(v) and 0 <= v <= 1):
            raise err(f"train.{name}", f"expected a fraction of the steps in [0, 1], got {v}")
    if t.selector_warmup_ratio + t.selector_ramp_ratio > 1:
        raise err("train.selector_ramp_ratio", f"warm-up {t.selector_warmup_ratio} + ramp "
                                               f"{t.selector_ramp_ratio} exceed the run (1)")
