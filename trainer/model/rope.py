"""The drafter's rotary embedding, built from the target's config by transformers itself.

The drafter attends at the target's absolute positions, so its RoPE must be the target's:
same base, same scaling (linear, dynamic NTK, YaRN, LongRoPE, Llama-3) and the same
attention scaling factor multiplied into cos/sin (YaRN: ``0.1*ln(factor)+1``). Rather
than re-deriving any of that, ``DrafterRope`` wraps the rotary-embedding module of the
target's own model family (``transformers.models.<model_type>``; Qwen3's as the fallback,
which reads only the generic ``rope_parameters``), whose ``__init__`` runs transformers'
``ROPE_INIT_FUNCTIONS`` and whose ``forward`` applies ``attention_scaling`` and the
dynamic/LongRoPE updates. Without a config (unit tests building a spec by hand) it is the
plain ``theta`` RoPE.

``forward(positions [b, T])`` returns fp32 ``(cos, sin)`` of shape ``[b, 1, T, head_dim]``.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn


def rotary_class(tcfg):
    """transformers' rotary-embedding class for the config's model family (fallback Qwen3)."""
    mt = str(getattr(tcfg, "model_type", "") or "")
    if mt:
        try:
            mod = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
            for name in dir(mod):
                if name.endswith("RotaryEmbedding") and name.lower().startswith(mt.replace("_", "")):
                    return getattr(mod, name)
        except ImportError:
            pass
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    return Qwen3RotaryEmbedding


def rope_parameters_of(tcfg) -> dict:
    """The config's RoPE parameters as one dict (5.x ``rope_parameters``; 4.x ``rope_theta`` +
    ``rope_scaling``), for the export's config.json and for reports."""
    params = getattr(tcfg, "rope_parameters", None)
    if isinstance(params, dict) and params:
        return dict(params)
    out = dict(getattr(tcfg, "rope_scaling", None) or {})
    out.setdefault("rope_type", out.pop("type", "default"))
    out["rope_theta"] = float(getattr(tcfg, "rope_theta", 10000.0))
    return out


class DrafterRope(nn.Module):
    def __init__(self, tcfg=None, *, head_dim: int, theta: float = 10000.0):
        super().__init__()
        self.hf = None
        if tcfg is not None:
            self.hf = rotary_class(tcfg)(tcfg)
            self.rope_type = getattr(self.hf, "rope_type", "default")
        else:
            inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
            self.register_buffer("inv_freq", inv.float(), persistent=False)
            self.rope_type = "default"

    @property
    def attention_scaling(self) -> float:
        return float(getattr(self.hf, "attention_scaling", 1.0)) if self.hf is not None else 1.0

    def forward(self, positions: torch.Tensor):
        if self.hf is not None:
            probe = torch.empty(0, dtype=torch.float32, device=positions.device)
            with torch.autocast(device_type=positions.device.type, enabled=False):
                cos, sin = self.hf(probe, positions)
            return cos.float().unsqueeze(1), sin.float().unsqueeze(1)
        freqs = positions.float().unsqueeze(-1) * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
