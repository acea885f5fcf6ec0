"""What an export's attention fields make each serving engine run (pure, torch-free).

An export declares its draft layers' attention with ``layer_types`` (``full_attention`` /
``sliding_attention``), ``sliding_window`` and ``is_causal``. Each engine turns those
fields into a mask per layer (docs/trainer.md, "Attention as served", names the source read
for each):

- ``is_causal`` present: every layer causal within the block when true, bidirectional when
  false; a non-causal sliding window is symmetric (|p - j| < W), so a block no longer than
  the window is wholly visible and the context starts at ``anchor + k - (W - 1)``;
- ``is_causal`` absent: z-lab's class, vLLM (after ``dflash_config.causal``) and SGLang
  apply the legacy rule (sliding layers causal, full layers bidirectional); llama.cpp runs
  every draft layer bidirectionally.

``export_fields`` writes the fields for a trained pattern; ``served_pattern``
(``dfo_contract.trainer_config.layers``, where ``model.init_from`` reads them too) reads them
back as one engine does; ``check_served`` refuses a pattern some engine would serve differently
from how it was trained, naming the engine and the layer.
"""

from __future__ import annotations

from dfo_contract.trainer_config.layers import (ENGINES, LayerAttention, Unservable,
                                                parse_engines, served_pattern)
__all__ = ["ENGINES", "Unservable", "check_served", "export_fields", "parse_engines",
           "served_pattern"]


def export_fields(pattern: tuple[LayerAttention, ...]) -> dict:
    """``config.json``'s attention fields for ``pattern`` (one entry per draft layer)."""
    n = len(pattern)
    windows = sorted({la.window for la in pattern if la.window})
    if len(windows) > 1:
        raise Unservable(f"sliding layers with windows {windows}: config.json holds one "
                         "sliding_window for every sliding layer")
    w = windows[0] if windows else 0
    out: dict = {"layer_types": [la.kind for la in pattern], "sliding_window": w or None,
                 "use_sliding_window": bool(w), "max_window_layers": n}
    causal = {la.causal for la in pattern}
    if len(causal) == 1:
        out["is_causal"] = causal.pop()
    return out


def check_served(pattern: tuple[LayerAttention, ...], conf: dict,
                 engines: tuple[str, ...] = ENGINES) -> None:
    """Raise ``Unservable`` naming the first of ``engines`` and the first layer that ``conf``
    would make run differently from ``pattern``."""
    for engine in engines:
        got = served_pattern(conf, engine)
        for i, (want, have) in enumerate(zip(pattern, got)):
            if want != have:
                raise Unservable(f"{engine} serves layer {i} as {have.describe()}, but it was "
                                 f"trained {want.describe()}")
