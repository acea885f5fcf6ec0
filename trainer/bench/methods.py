"""``--methods``: the drafters one ``python -m trainer.bench`` run measures side by side.

Each method (every registered one: ``dflash``, ``dflash2``) gets its own drafter on the same target, batch and
target features, and runs the same variants and candidates; its FLOPs are its own (DFlash2:
the grouped dynamic convolutions, the path selector, and the sliding window's visible
pairs; ``DrafterMethod.extra_flops``). With two, ``ratios`` gives the second registered over the
first (DFlash2 over DFlash) per variant measured by both.
"""

from __future__ import annotations

from dataclasses import asdict

from dfo_contract.trainer_config import methods as method_registry
from dfo_contract.trainer_config.layers import layer_pattern

from ..core.methods import method_of
from .flops import drafter_flops, pattern_pairs

#: the bench flags a method takes when its own settings have them (``apply_method``)
SETTING_FLAGS = ("selector_rank", "selector_top_k")


def known_methods() -> tuple[str, ...]:
    """The methods ``--methods`` takes: every registered one (``trainer.core.methods``)."""
    return method_registry.names()


def parse_methods(text: str) -> list[str]:
    """The comma-separated ``--methods``; ValueError (one line) names an unknown one."""
    out = [m.strip() for m in text.split(",") if m.strip()]
    known = known_methods()
    bad = [m for m in out if m not in known]
    if bad or not out:
        raise ValueError(f"unknown --methods entry {bad[0] if bad else text!r} "
                         f"(known: {', '.join(known)})")
    return list(dict.fromkeys(out))


def apply_method(cfg, a, method: str) -> None:
    """``cfg`` set to train ``method`` at the bench's settings (in place): ``--sliding-window``
    for a method whose layers slide, ``--selector-rank``/``--selector-top-k`` for one whose
    own settings have them (DFlash2)."""
    cfg.model.method = method
    m = method_of(method)
    if m.sliding_layers and a.sliding_window is not None:
        cfg.model.sliding_window = a.sliding_window
    for name in SETTING_FLAGS:
        if name in m.setting_names() and getattr(a, name) is not None:
            cfg.model.set_flat(name, getattr(a, name))


def method_report(cfg) -> dict | None:
    """The report's ``config`` of a method with its own settings (its layers and settings)."""
    own = cfg.model.settings()
    if own is None:
        return None
    return {"sliding_window": cfg.model.sliding_window, "is_causal": cfg.model.is_causal,
            **asdict(own)}


def step_flops(cfg, spec, batch, seq_len: int) -> tuple[dict, int]:
    """(``drafter_flops`` of ``cfg``'s method on ``batch``, its visible pairs)."""
    bs = cfg.model.block_size
    b, n = batch.anchors.shape
    m = method_of(cfg)
    tq, rows = b * n * bs, b * n * (bs - 1)
    extra = None if m.extra_flops is None else m.extra_flops(spec, m.own_spec(cfg.model), tq=tq,
                                                             label_rows=rows)
    pairs = pattern_pairs(batch.anchors, batch.anchor_valid, bs, layer_pattern(cfg.model))
    return drafter_flops(spec, seq_len=b * seq_len, tq=tq, pairs=pairs, label_rows=rows,
                         extra=extra), pairs


def _ratio(x, y):
    return round(x / y, 4) if x is not None and y else None


def compared(methods: dict) -> tuple[str, str] | None:
    """(base, other): the first two registered methods measured (DFlash, DFlash2), or None."""
    both = [n for n in known_methods() if n in methods][:2]
    return (both[0], both[1]) if len(both) == 2 else None


def ratios(methods: dict) -> dict:
    """The second registered method measured over the first (DFlash2 / DFlash) per variant
    both measured: step time, FLOPs, achieved TFLOP/s, MFU."""
    pair = compared(methods)
    if pair is None:
        return {}
    one, two = methods[pair[0]], methods[pair[1]]
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


def ratio_markdown(r: dict, methods: dict) -> list[str]:
    pair = compared(methods)
    if not r or pair is None:
        return []
    one, two = (method_registry.contract(n).label for n in pair)
    lines = ["", f"{two} / {one} at the same shape:", "",
             "| variant | step time | FLOPs | TFLOP/s | MFU |", "|---|---|---|---|---|"]
    for name, q in r.items():
        lines.append(f"| {name} | {q['step_time']} | {q['flops']} | {q['tflops']} | {q['mfu']} |")
    return lines
