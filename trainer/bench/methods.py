"""``--methods``: the drafters one ``python -m trainer.bench`` run measures side by side.

Each method (``dflash``, ``dflash2``) gets its own drafter on the same target, batch and
target features, and runs the same variants and candidates; its FLOPs are its own (DFlash2:
the grouped dynamic convolutions, the path selector, and the sliding window's visible
pairs). With both, ``ratios`` gives DFlash2 over DFlash per variant measured by both.
"""

from __future__ import annotations

from dfo_contract.trainer_config.layers import layer_pattern

from .flops import drafter_flops, pattern_pairs

METHODS = ("dflash", "dflash2")


def parse_methods(text: str) -> list[str]:
    """The comma-separated ``--methods``; ValueError (one line) names an unknown one."""
    out = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in out if m not in METHODS]
    if bad or not out:
        raise ValueError(f"unknown --methods entry {bad[0] if bad else text!r} "
                         f"(known: {', '.join(METHODS)})")
    return list(dict.fromkeys(out))


def apply_method(cfg, a, method: str) -> None:
    """``cfg`` set to train ``method`` at the bench's DFlash2 settings (in place)."""
    cfg.model.method = method
    if method == "dflash2":
        if a.sliding_window is not None:
            cfg.model.sliding_window = a.sliding_window
        if a.selector_rank is not None:
            cfg.model.selector_rank = a.selector_rank
        if a.selector_top_k is not None:
            cfg.model.selector_top_k = a.selector_top_k


def step_flops(cfg, spec, batch, seq_len: int) -> tuple[dict, int]:
    """(``drafter_flops`` of ``cfg``'s method on ``batch``, its visible pairs)."""
    bs = cfg.model.block_size
    b, n = batch.anchors.shape
    d2 = None
    if cfg.model.method == "dflash2":
        from ..model.dflash2 import DFlash2Spec

        d2 = DFlash2Spec.from_config(cfg.model)
    pairs = pattern_pairs(batch.anchors, batch.anchor_valid, bs, layer_pattern(cfg.model))
    return drafter_flops(spec, seq_len=b * seq_len, tq=b * n * bs, pairs=pairs,
                         label_rows=b * n * (bs - 1), d2=d2), pairs


def _ratio(x, y):
    return round(x / y, 4) if x is not None and y else None


def ratios(methods: dict) -> dict:
    """DFlash2 / DFlash per variant both measured: step time, FLOPs, achieved TFLOP/s, MFU."""
    if "dflash" not in methods or "dflash2" not in methods:
        return {}
    one, two = methods["dflash"], methods["dflash2"]
    out = {}
    for name, v1 in one["variants"].items():
        v2 = two["variants"].get(name, {})
        if "drafter_step_ms" not in v1 or "drafter_step_ms" not in v2:
            continue
        out[name] = {"step_time": _ratio(v2["drafter_step_ms"], v1["drafter_step_ms"]),
                     "flops": _ratio(v2["drafter_flops"], v1["drafter_flops"]),
                     "tflops": _ratio(v2["drafter_tflops"], v1["drafter_tflops"]),
                     "mfu": _ratio(v2["drafter_mfu"], v1["drafter_mfu"])}
    return out


def ratio_markdown(r: dict) -> list[str]:
    if not r:
        return []
    lines = ["", "DFlash2 / DFlash at the same shape:", "",
             "| variant | step time | FLOPs | TFLOP/s | MFU |", "|---|---|---|---|---|"]
    for name, q in r.items():
        lines.append(f"| {name} | {q['step_time']} | {q['flops']} | {q['tflops']} | {q['mfu']} |")
    return lines
