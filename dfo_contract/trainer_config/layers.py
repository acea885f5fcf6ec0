"""The draft layers' attention pattern as data (pure, torch-free).

Each draft layer is ``full_attention`` or ``sliding_attention`` (window W) and, within its
block, bidirectional (every slot sees the whole block) or causal (slot k sees slots <= k):
``LayerAttention(window, causal)``. A query at slot k of a block anchored at ``a``
(position p = a + k) sees

- context ``j < a``, and in a sliding layer only ``j >= p - (W - 1)``;
- its own block: every slot, or in a causal layer the slots ``<= k``.

This is what z-lab's DFlash and DFlash2 classes and the serving engines do with an export's
``layer_types``, ``sliding_window`` and ``is_causal`` (a non-causal sliding window is
symmetric, |p - j| < W, so a block no longer than W is wholly visible).

Config: ``model.layer_types`` (one entry per draft layer; unset: every layer
``full_attention`` for DFlash, ``sliding_attention`` for DFlash2 unless
``model.sliding_window`` is 0), ``model.sliding_window`` (W of the sliding layers) and
``model.is_causal`` (false: every layer bidirectional within the block; true: every layer
causal; null: sliding layers causal and full ones bidirectional, the rule engines apply to
a config without ``is_causal``).

``served_pattern`` reads an export's fields back as one engine serves them (z-lab's class for
``model.init_from``, ``trainer_config.drafter_dir``); ``Unservable`` names what none serves.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import methods as method_registry

FULL, SLIDING = "full_attention", "sliding_attention"
#: the serving engines whose reading of an export's attention fields dfo models: z-lab's
#: class, vLLM 0.28+ (``vllm``), vLLM releases before 0.28 (``vllm-0.27``), SGLang, LMDeploy,
#: llama.cpp (docs/trainer.md, "Attention as served")
ENGINES = ("z-lab", "vllm", "vllm-0.27", "sglang", "lmdeploy", "llama.cpp")
#: the engines that read ``dflash_config.causal`` and ignore a top-level ``is_causal``
CAUSAL_KEY_ONLY = ("vllm-0.27", "lmdeploy")
LAYER_TYPES = (FULL, SLIDING)


@dataclass(frozen=True)
class LayerAttention:
    window: int = 0          # 0: full attention; else the sliding window W (counts the query)
    causal: bool = False     # within the block: slot k sees slots <= k

    @property
    def kind(self) -> str:
        return SLIDING if self.window else FULL

    def describe(self) -> str:
        where = f"sliding window {self.window}" if self.window else "full"
        return f"{where}, {'causal' if self.causal else 'bidirectional'} within the block"


def layer_types(model_cfg) -> list[str]:
    """``model.layer_types``, or the method's default for ``model.drafter_layers`` layers."""
    m = model_cfg
    if m.layer_types:
        return list(m.layer_types)
    c = method_registry.known(m.method)
    sliding = c is not None and c.sliding_layers and m.sliding_window > 0
    return [SLIDING if sliding else FULL] * int(m.drafter_layers)


def causal_of(kind: str, is_causal: bool | None) -> bool:
    """Whether a layer of ``kind`` is causal within the block under ``is_causal``."""
    return (kind == SLIDING) if is_causal is None else bool(is_causal)


def layer_pattern(model_cfg) -> tuple[LayerAttention, ...]:
    """One ``LayerAttention`` per draft layer, from the model config."""
    m = model_cfg
    return tuple(LayerAttention(window=int(m.sliding_window) if t == SLIDING else 0,
                                causal=causal_of(t, m.is_causal))
                 for t in layer_types(m))


def validate_layers(model_cfg, err) -> None:
    """Raise ``err(flag, why)`` for a layer pattern dfo cannot train."""
    m = model_cfg
    if m.is_causal is not None and not isinstance(m.is_causal, bool):
        raise err("model.is_causal", f"expected true, false or null, got {m.is_causal!r}")
    if not isinstance(m.sliding_window, int) or isinstance(m.sliding_window, bool) \
            or m.sliding_window < 0:
        raise err("model.sliding_window", f"expected an integer >= 0 (0: full attention), "
                                          f"got {m.sliding_window!r}")
    if m.layer_types is None:
        return
    if not m.layer_types:
        raise err("model.layer_types", "expected one entry per draft layer, or null for the "
                                       "method's default")
    bad = [t for t in m.layer_types if t not in LAYER_TYPES]
    if bad:
        raise err("model.layer_types", f"{bad[0]!r} is not a layer type dfo trains (expected "
                                       f"{' or '.join(LAYER_TYPES)})")
    if len(m.layer_types) != m.drafter_layers:
        raise err("model.layer_types", f"{len(m.layer_types)} entries for "
                                       f"model.drafter_layers={m.drafter_layers}")
    if SLIDING in m.layer_types and m.sliding_window == 0:
        raise err("model.sliding_window", "0 (no window), but model.layer_types has "
                                          "sliding_attention layers; set a window >= "
                                          "model.block_size")


def validate_window(model_cfg, err) -> None:
    """A window that is used must hold a whole block."""
    m = model_cfg
    if any(la.window for la in layer_pattern(m)) and m.sliding_window < m.block_size:
        raise err("model.sliding_window", f"must be 0 or >= model.block_size ({m.block_size}), "
                                          f"got {m.sliding_window}")


class Unservable(ValueError):
    """Attention fields no engine serves as a drafter dfo trains, or a trained pattern that
    some engine would serve differently (``trainer.evaluate.served.check_served``)."""


def parse_engines(text: str) -> tuple[str, ...]:
    """``--engines`` (comma separated, or ``all``) as engine names; ValueError naming a bad one."""
    names = ENGINES if text.strip() in ("", "all") else tuple(
        dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in ENGINES]
    if bad:
        raise ValueError(f"unknown engine {bad[0]!r} (known: {', '.join(ENGINES)}, or all)")
    return names


def served_pattern(conf: dict, engine: str = "z-lab") -> tuple[LayerAttention, ...]:
    """Each draft layer's attention as ``engine`` serves a config.json object ``conf``;
    ``Unservable`` for fields no engine serves as a drafter dfo trains."""
    n = int(conf["num_hidden_layers"])
    types = list(conf.get("layer_types") or [FULL] * n)
    if len(types) != n:
        raise Unservable(f"layer_types has {len(types)} entries for {n} layers")
    bad = [t for t in types if t not in (FULL, SLIDING)]
    if bad:
        raise Unservable(f"layer type {bad[0]!r} is not one dfo trains")
    w = int(conf.get("sliding_window") or 0)
    if SLIDING in types and not w:
        raise Unservable("sliding_attention layers without a sliding_window")
    if engine == "z-lab" and not conf.get("use_sliding_window"):
        w = 0   # transformers' Qwen3Config drops sliding_window unless use_sliding_window
    is_causal = conf.get("is_causal")
    dc_causal = (conf.get("dflash_config") or {}).get("causal")
    if engine in CAUSAL_KEY_ONLY:
        is_causal = dc_causal
    elif is_causal is None and engine == "vllm":
        is_causal = dc_causal
    if engine == "llama.cpp":
        # its converter writes `attention.causal` only for `is_causal: false`, and its DFlash
        # drafter runs non-causal unless the GGUF says `dflash.attention.causal: true`
        is_causal = False
    return tuple(LayerAttention(window=w if t == SLIDING else 0,
                                causal=causal_of(t, None if is_causal is None else bool(is_causal)))
                 for t in types)
