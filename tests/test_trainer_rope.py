"""The drafter's RoPE equals transformers' for every scaling type, attention scaling included."""

from __future__ import annotations

import pytest
import torch

from trainer.model.drafter import Drafter, DrafterSpec, SharedHead, apply_rope
from trainer.model.rope import DrafterRope, rope_parameters_of

HEAD_DIM = 16
MAX_POS = 64

ROPE_TYPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 4.0,
             "original_max_position_embeddings": 32},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0,
                 "short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
                 "long_factor": [2.0 + 0.3 * i for i in range(HEAD_DIM // 2)],
                 "original_max_position_embeddings": 32},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
}


def _config(params: dict, max_pos: int = MAX_POS):
    from transformers import Qwen3Config

    return Qwen3Config(hidden_size=64, num_hidden_layers=2, vocab_size=128, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=HEAD_DIM, intermediate_size=128,
                       max_position_embeddings=max_pos, rope_parameters=dict(params))


def _reference(cfg, positions):
    """A fresh transformers rotary embedding of the target family (what the target uses)."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    ref = Qwen3RotaryEmbedding(cfg)
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = ref(x, positions)
    return cos, sin, float(ref.attention_scaling)


@pytest.mark.parametrize("kind", sorted(ROPE_TYPES))
@pytest.mark.parametrize("span", [40, 200])  # inside / beyond the original context
def test_cos_sin_equal_transformers(kind, span):
    cfg = _config(ROPE_TYPES[kind])
    pos = torch.arange(span).unsqueeze(0)
    cos_ref, sin_ref, scale_ref = _reference(cfg, pos)
    rope = DrafterRope(cfg, head_dim=HEAD_DIM)
    cos, sin = rope(pos)
    assert cos.shape == (1, 1, span, HEAD_DIM)
    torch.testing.assert_close(cos[:, 0], cos_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin[:, 0], sin_ref, rtol=0, atol=1e-6)
    assert rope.attention_scaling == pytest.approx(scale_ref)


def test_yarn_scaling_is_applied_and_differs_from_plain_theta():
    """A drafter with RoPE from theta alone is off by up to ~1.9 with YaRN: it never scales."""
    cfg = _config(ROPE_TYPES["yarn"])
    pos = torch.arange(200).unsqueeze(0)
    rope = DrafterRope(cfg, head_dim=HEAD_DIM)
    plain = DrafterRope(None, head_dim=HEAD_DIM, theta=1_000_000.0)
    assert rope.attention_scaling == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1.0)
    cos, _ = rope(pos)
    cos_plain, _ = plain(pos)
    assert (cos - cos_plain).abs().max().item() > 0.1
    # norm of (cos, sin) pairs carries the attention scaling
    c, s = rope(pos)
    torch.testing.assert_close((c ** 2 + s ** 2).sqrt(), torch.full_like(c, rope.attention_scaling))


def test_drafter_uses_target_rope_at_absolute_positions():
    """The drafter's q/k rotation equals transformers' apply_rotary_pos_emb with the target's
    rotary embedding, for context and block positions."""
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    cfg = _config(ROPE_TYPES["yarn"])
    spec = DrafterSpec.from_target_config(cfg, num_layers=1, num_taps=1)
    emb = torch.nn.Embedding(128, 64)
    head = torch.nn.Linear(64, 128, bias=False)
    d = Drafter(spec, SharedHead(emb, head))
    seen = {}

    def attend(q, k, v):
        seen["q"], seen["k"] = q, k
        return torch.zeros_like(q)

    feats = torch.randn(1, 10, 64)
    pos = torch.arange(6, 14).unsqueeze(0)
    d(feats, torch.zeros(1, 8, dtype=torch.long), pos, attend)
    attn = d.layers[0].self_attn
    x = d.layers[0].input_layernorm(emb(torch.zeros(1, 8, dtype=torch.long)))
    q = attn.q_norm(attn.q_proj(x).view(1, 8, 4, HEAD_DIM)).transpose(1, 2)
    cos, sin, _ = _reference(cfg, torch.cat([torch.arange(10).unsqueeze(0), pos], 1))
    q_ref, _ = apply_rotary_pos_emb(q, q, cos[:, 10:], sin[:, 10:])
    torch.testing.assert_close(seen["q"], q_ref, rtol=1e-5, atol=1e-5)
    assert seen["k"].shape[2] == 18


def test_rope_parameters_of_reads_both_spellings():
    cfg = _config(ROPE_TYPES["yarn"])
    p = rope_parameters_of(cfg)
    assert p["rope_type"] == "yarn" and p["factor"] == 4.0 and p["rope_theta"] == 1_000_000.0
    apply_rope  # noqa: B018 - imported for the module's public surface
