"""The target shapes the benchmarks run at (``--target``): Qwen3 models' published
dimensions, random weights."""

from __future__ import annotations

from typing import Any

#: name -> Qwen3Config fields (the models' config.json on the Hub)
TARGETS: dict[str, dict[str, Any]] = {
    "qwen3-4b": dict(hidden_size=2560, num_hidden_layers=36, intermediate_size=9728,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     vocab_size=151936, tie_word_embeddings=False),
}


def target_config(name: str):
    """A ``Qwen3Config`` of the named shape; ValueError names the known ones."""
    from transformers import Qwen3Config

    if name not in TARGETS:
        raise ValueError(f"unknown --target {name!r} (known: {', '.join(TARGETS)})")
    return Qwen3Config(max_position_embeddings=40960, rms_norm_eps=1e-6, **TARGETS[name])
