"""The DFlash drafter as a transformers model, for ``trust_remote_code`` loading.

``python -m trainer export`` copies this file into every export directory as
``modeling_dflash.py`` and points ``config.json``'s ``auto_map`` at it, so

    AutoModel.from_pretrained(EXPORT_DIR, trust_remote_code=True)

builds this module (not a plain Qwen3Model) and loads every weight of ``model.safetensors``
(``fc``, ``hidden_norm``, ``layers.N.*``, ``norm``) strictly. It imports torch and
transformers only, nothing of dfo. The architecture is ``trainer.model.drafter``'s:

- ``fc`` (k*H -> H, no bias) + ``hidden_norm`` project the k tapped target states of the
  context; L Qwen3 decoder layers whose queries come from the block tokens only and whose
  keys/values come from [context | block tokens] (same projections and k_norm for both),
  non-causal; RoPE at absolute positions; a final norm. No embedding and no LM head: the
  target's are used.

``forward(position_ids, noise_embedding, target_hidden, attention_mask=None,
past_key_values=None, ...)`` returns the final hidden states of the block tokens.
``position_ids`` cover [context | block] (``ctx_len + block_len`` positions);
``attention_mask`` (optional) is a boolean or additive mask broadcastable to
``[b, heads, block_len, kv_len]``; with a transformers ``Cache`` in ``past_key_values`` the
keys/values of earlier calls are prepended (the context is then the new positions only).
This is the calling convention of z-lab's DFlash generation loop. ``target_layer_ids``,
``block_size`` and ``mask_token_id`` come from the config's ``dflash_config``.

Without ``attention_mask`` each layer attends as the config declares: ``layer_types``
(``full_attention`` / ``sliding_attention`` with ``sliding_window``) and ``is_causal``
(false: the whole block visible to each of its slots; true: slot k sees slots <= k;
absent: sliding layers causal, full ones bidirectional). A sliding layer's query at
position p sees context keys ``j > p - sliding_window``. Keys held in the cache are taken
at positions 0, 1, ... in order, as in z-lab's loop.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (Qwen3MLP, Qwen3PreTrainedModel,
                                                      Qwen3RMSNorm, Qwen3RotaryEmbedding)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return (x32 * cos + _rotate_half(x32) * sin).to(x.dtype)


class DFlashAttention(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, x, ctx, cos, sin, attention_mask=None, past_key_values=None):
        b, tq, _ = x.shape
        kv_in = torch.cat([ctx, x], dim=1)
        tk = kv_in.shape[1]
        q = self.q_norm(self.q_proj(x).view(b, tq, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_in).view(b, tk, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(kv_in).view(b, tk, self.kv_heads, self.head_dim).transpose(1, 2)
        q = _apply_rope(q, cos[:, :, -tq:], sin[:, :, -tq:])
        k = _apply_rope(k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, tq, self.heads * self.head_dim))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DFlashAttention(config, layer_idx)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)

    def forward(self, x, ctx, cos, sin, attention_mask=None, past_key_values=None):
        x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin, attention_mask,
                               past_key_values)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(Qwen3PreTrainedModel):
    config_class = Qwen3Config
    _no_split_modules = ["DFlashDecoderLayer"]

    def __init__(self, config: Qwen3Config):
        super().__init__(config)
        dc: dict[str, Any] = dict(getattr(config, "dflash_config", None) or {})
        self.target_layer_ids = list(dc["target_layer_ids"])
        self.mask_token_id = dc.get("mask_token_id")
        size: Any = dc.get("block_size") or getattr(config, "block_size", 16)
        self.block_size = int(size)
        h = config.hidden_size
        self.fc = nn.Linear(len(self.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i)
                                    for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        n = config.num_hidden_layers
        types = list(getattr(config, "layer_types", None) or ["full_attention"] * n)
        causal = getattr(config, "is_causal", None)
        window = int(getattr(config, "sliding_window", None) or 0)
        # (window, causal within the block) per layer
        self.layer_attention = [(window if t == "sliding_attention" else 0,
                                 (t == "sliding_attention") if causal is None else bool(causal))
                                for t in types]
        self.post_init()

    def _layer_masks(self, position_ids, tq: int, past_len: int):
        """One boolean mask [b, 1, tq, kv] per layer (None where every key is visible)."""
        kpos = position_ids
        if past_len:
            past = torch.arange(past_len, device=kpos.device).unsqueeze(0).expand(kpos.shape[0], -1)
            kpos = torch.cat([past, kpos], dim=1)
        qpos = position_ids[:, -tq:]
        kv = kpos.shape[1]
        in_block = (torch.arange(kv, device=kpos.device) >= kv - tq).view(1, 1, -1)
        diff = qpos.unsqueeze(-1) - kpos.unsqueeze(1)                      # [b, tq, kv]
        made, out = {}, []
        for window, causal in self.layer_attention:
            if (window, causal) not in made:
                ok = torch.ones_like(diff, dtype=torch.bool)
                if window:
                    ok = ok & (in_block | (diff < window))
                if causal:
                    ok = ok & (~in_block | (diff >= 0))
                made[(window, causal)] = None if bool(ok.all()) else ok.unsqueeze(1)
            out.append(made[(window, causal)])
        return out

    def forward(self, position_ids: torch.LongTensor, noise_embedding: torch.Tensor,
                target_hidden: torch.Tensor, attention_mask: torch.Tensor | None = None,
                past_key_values=None, **kwargs) -> torch.Tensor:
        ctx = self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))
        x = noise_embedding.to(ctx.dtype)
        probe = torch.empty(0, dtype=torch.float32, device=x.device)
        with torch.autocast(device_type=x.device.type, enabled=False):
            cos, sin = self.rotary_emb(probe, position_ids)
        cos, sin = cos.float().unsqueeze(1), sin.float().unsqueeze(1)
        if attention_mask is None:
            past = int(past_key_values.get_seq_length()) if past_key_values is not None else 0
            masks = self._layer_masks(position_ids, x.shape[1], past)
        else:
            masks = [attention_mask] * len(self.layers)
        for layer, mask in zip(self.layers, masks, strict=True):
            x = layer(x, ctx, cos, sin, mask, past_key_values)
        return self.norm(x)
