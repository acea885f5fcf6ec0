"""What an export's attention fields make each serving engine run (pure, torch-free).

An export declares its draft layers' attention with ``layer_types`` (``full_attention`` /
``sliding_attention``), ``sliding_window`` and ``is_causal``. Each engine turns those
fields into a mask per layer (docs/trainer.md, "Attention as served", names the source read
for each):

- ``is_causal`` present: every layer causal within the block when true, bidirectional when
  false (z-lab's class, vLLM 0.28+, SGLang); a non-causal sliding window is symmetric
  (|p - j| < W), so a block no longer than the window is wholly visible and the context
  starts at ``anchor + k - (W - 1)``;
- vLLM releases before 0.28 and LMDeploy ignore ``is_causal`` and read
  ``dflash_config.causal`` (an export writes both, the same value); vLLM 0.28+ reads it
  when ``is_causal`` is absent;
- neither: the legacy rule (sliding layers causal, full layers bidirectional);
- llama.cpp runs every draft layer bidirectionally, ``is_causal: true`` included (its
  converter carries only ``false`` into the GGUF).

``export_fields`` writes the fields for a trained pattern (``with_export_fields``: into a
config.json object); ``served_pattern``
(``dfo_contract.trainer_config.layers``, where ``model.init_from`` reads them too) reads them
back as one engine does; ``check_served`` refuses a pattern some engine would serve differently
from how it was trained, naming the engine and the layer.
"""

from __future__ import annotations

from dfo_contract.trainer_config.layers import (ENGINES, LayerAttention, Unservable,
                                                parse_engines, served_pattern)
__all__ = ["ENGINES", "Unservable", "check_served", "export_fields", "parse_engines",
           "served_pattern", "with_export_fields"]


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
        out["dflash_config"] = {"causal": out["is_causal"]}
    return out


def with_export_fields(conf: dict, pattern: tuple[LayerAttention, ...]) -> dict:
    """``conf`` with ``pattern``'s attention fields (``export_fields``), its
    ``dflash_config`` keeping what it holds."""
    fields = export_fields(pattern)
    dc = {**(conf.get("dflash_config") or {}), **fields.pop("dflash_config", {})}
    return {**conf, **fields, "dflash_config": dc}


def check_served(pattern: tuple[LayerAttention, ...], conf: dict,
                 engines: tuple[str, ...] = ENGINES) -> None:
    """Raise ``Unservable`` naming the first of ``engines`` and the first layer that ``conf``
    would make run differently from ``pattern``."""
    for engine in engines:
        got = served_pattern(conf, engine)
        for i, (want, have) in enumerate(zip(pattern, got, strict=False)):
            if want != have:
                raise Unservable(f"{engine} serves layer {i} as {have.describe()}, but it was "
                                 f"trained {want.describe()}")
