"""The DFlash drafter's architecture, and nothing else (no compile, no parallelism, no loss).

- ``fc`` (k*H -> H, no bias) + ``hidden_norm`` (RMSNorm) turn the k tapped target hidden
  states of the context into one context feature per position.
- L Qwen3 decoder layers: RMSNorm -> attention (q_norm/k_norm, the target's RoPE incl.
  its scaling, built by transformers: ``trainer.model.rope``) -> residual ->
  RMSNorm -> SwiGLU MLP -> residual; then a final RMSNorm.
- Attention: Q from the block tokens only; K and V from [context features | block tokens]
  with the same projections (and k_norm) for both; RoPE at absolute positions (context
  0..S-1, block slot k at anchor+k). The visibility pattern is not the model's business:
  ``forward`` takes ``attend(q, k, v) -> out`` callables built by ``trainer.model.attention``
  for each layer's pattern (``DrafterSpec.attention``: full or sliding, bidirectional or
  causal within the block).
- The token embedding and the LM head are the target's, shared and frozen; they live in
  ``self.shared`` and are excluded from ``trainable_state_dict()``.

Parameter names follow the public DFlash checkpoints (``fc``, ``hidden_norm``,
``layers.N.self_attn.q_proj``, ``layers.N.mlp.gate_proj``, ``norm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dfo_contract.trainer_config.layers import LayerAttention
from dfo_contract.trainer_config.methods import DEFAULT_METHOD

from .rope import DrafterRope

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class DrafterSpec:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    num_layers: int
    num_taps: int
    vocab: int
    eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    init_std: float = 0.02
    # the target's transformers config: RoPE (incl. scaling) is built from it by transformers
    # (trainer.model.rope); None = plain RoPE with ``rope_theta``
    rope_config: object = field(default=None, compare=False, repr=False)
    # each draft layer's attention (window, causal within the block); () = every layer full
    # and bidirectional (dfo_contract.trainer_config.layers)
    attention: tuple[LayerAttention, ...] = ()

    @property
    def pattern(self) -> tuple[LayerAttention, ...]:
        return self.attention or (LayerAttention(),) * self.num_layers

    @classmethod
    def from_target_config(cls, tcfg, *, num_layers: int, num_taps: int,
                           attention: tuple[LayerAttention, ...] = ()) -> "DrafterSpec":
        """Width, heads and MLP size equal the target's (a transformers Qwen3-style config)."""
        heads = tcfg.num_attention_heads
        head_dim = getattr(tcfg, "head_dim", None) or tcfg.hidden_size // heads
        return cls(hidden=tcfg.hidden_size, heads=heads,
                   kv_heads=getattr(tcfg, "num_key_value_heads", None) or heads,
                   head_dim=head_dim, intermediate=tcfg.intermediate_size,
                   num_layers=num_layers, num_taps=num_taps, vocab=tcfg.vocab_size,
                   eps=getattr(tcfg, "rms_norm_eps", 1e-6), rope_theta=rope_theta_of(tcfg),
                   rope_config=tcfg, attention=tuple(attention))


def rope_theta_of(tcfg) -> float:
    """RoPE base of a transformers config (4.x ``rope_theta``; 5.x ``rope_parameters``)."""
    params = getattr(tcfg, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    theta = getattr(tcfg, "rope_theta", None)
    return float(theta) if theta is not None else 10000.0


class RMSNorm(nn.Module):
    """Qwen3-style RMSNorm: normalize in fp32, scale, cast back."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in fp32, result in x's dtype (compiled, this fuses into one kernel)."""
    x32 = x.float()
    return (x32 * cos + rotate_half(x32) * sin).to(x.dtype)


class DrafterAttention(nn.Module):
    def __init__(self, s: DrafterSpec):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = s.heads, s.kv_heads, s.head_dim
        self.q_proj = nn.Linear(s.hidden, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
        self.q_norm = RMSNorm(s.head_dim, s.eps)
        self.k_norm = RMSNorm(s.head_dim, s.eps)

    def forward(self, x, ctx, rope_q, rope_k, attend: Attend):
        b, tq, _ = x.shape
        kv_in = torch.cat([ctx, x], dim=1)                      # [b, S+Tq, H]
        tk = kv_in.shape[1]
        q = self.q_norm(self.q_proj(x).view(b, tq, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_in).view(b, tk, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(kv_in).view(b, tk, self.kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rope(q, *rope_q)
        k = apply_rope(k, *rope_k)
        out = attend(q, k, v)                                   # [b, heads, Tq, head_dim]
        return self.o_proj(out.transpose(1, 2).reshape(b, tq, self.heads * self.head_dim))


class DrafterMLP(nn.Module):
    def __init__(self, s: DrafterSpec):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, s: DrafterSpec):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.self_attn = DrafterAttention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)
        self.mlp = DrafterMLP(s)

    def forward(self, x, ctx, rope_q, rope_k, attend: Attend):
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_k, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


class SharedHead(nn.Module):
    """The target's token embedding and LM head: frozen, shared, never saved with the drafter."""

    def __init__(self, embed_tokens: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        for p in self.parameters():
            p.requires_grad_(False)


class Drafter(nn.Module):
    """The DFlash drafter. ``forward`` returns the final hidden states of the block tokens."""

    SHARED_PREFIX = "shared."
    #: the ``model.method`` this drafter trains (``trainer.core.methods``; its record sets it)
    method: str = DEFAULT_METHOD

    def __init__(self, spec: DrafterSpec, shared: SharedHead):
        super().__init__()
        self.spec = spec
        h = spec.hidden
        self.fc = nn.Linear(spec.num_taps * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, spec.eps)
        self.layers = nn.ModuleList(DrafterLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(h, spec.eps)
        # RoPE tables are computed, not initialized: on the CPU even while the parameters are
        # created on the meta device (build_drafter)
        with torch.device("cpu"):
            self.rope = DrafterRope(spec.rope_config, head_dim=spec.head_dim, theta=spec.rope_theta)
        self.shared = shared

    @torch.no_grad()
    def init_weights(self, seed: int, device=None) -> None:
        """Deterministic init: normal(0, init_std) for linears, ones for norms, drawn in
        parameter order from one CPU generator. A parameter still on the meta device is
        created on ``device`` (default cpu) with the value it would have been given."""
        g = torch.Generator(device="cpu").manual_seed(int(seed))
        for name, p in list(self.named_parameters()):
            if name.startswith(self.SHARED_PREFIX):
                continue
            val = None
            if p.ndim == 2:
                val = (torch.randn(p.shape, generator=g, dtype=torch.float32)
                       .mul_(self.spec.init_std).to(p.dtype))
            if not p.is_meta:
                if val is not None:
                    p.copy_(val)
                else:
                    p.fill_(1.0)
                continue
            dev = torch.device(device if device is not None else "cpu")
            new = (val.to(dev) if val is not None
                   else torch.ones(p.shape, dtype=p.dtype, device=dev))
            owner, _, attr = name.rpartition(".")
            setattr(self.get_submodule(owner), attr, nn.Parameter(new, requires_grad=p.requires_grad))

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.named_parameters()
                if not n.startswith(self.SHARED_PREFIX) and p.requires_grad]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith(self.SHARED_PREFIX)}

    def load_trainable_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        own = self.trainable_state_dict()
        missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
        if missing or unexpected:
            raise KeyError(f"drafter weights do not match the model: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
        for k, v in sd.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise KeyError(f"drafter weight {k}: shape {tuple(v.shape)} in the file, "
                               f"{tuple(own[k].shape)} in the model")
        self.load_state_dict(sd, strict=False)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.shared.embed_tokens(ids)

    def forward(self, features: torch.Tensor, block_ids: torch.Tensor,
                block_positions: torch.Tensor, attend: Attend | Sequence[Attend],
                ctx_positions: torch.Tensor | None = None) -> torch.Tensor:
        """features [b, S, k*H] (tapped target states), block_ids/positions [b, Tq];
        ``attend``: one callable for every layer, or one per layer (``spec.pattern``'s masks:
        ``trainer.model.attention.layer_attends``); ``ctx_positions`` [b, S]: the context's
        RoPE positions (packed rows: each sample's own; None: 0..S-1)."""
        attends = [attend] * len(self.layers) if callable(attend) else list(attend)
        if len(attends) != len(self.layers):
            raise ValueError(f"{len(attends)} attention callables for {len(self.layers)} layers")
        b, s, _ = features.shape
        ctx = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))
        x = self.embed(block_ids).to(ctx.dtype)
        ctx_pos = (torch.arange(s, device=features.device).unsqueeze(0).expand(b, s)
                   if ctx_positions is None else ctx_positions)
        # one cos/sin for [context | block] positions (one dynamic-RoPE update per forward);
        # the block's queries take the block part
        cos_k, sin_k = self.rope(torch.cat([ctx_pos, block_positions], dim=1))
        rope_k = (cos_k, sin_k)
        rope_q = (cos_k[:, :, s:], sin_k[:, :, s:])
        for layer, att in zip(self.layers, attends, strict=True):
            x = layer(x, ctx, rope_q, rope_k, att)
        return self.norm(x)


def build_drafter(make: Callable[[], Drafter], *, device, seed: int) -> Drafter:
    """``make()``'s drafter, its own parameters created on ``device`` by ``init_weights(seed)``.

    Bit for bit what ``make()`` then ``init_weights(seed)`` gives (the values come from the same
    CPU generator in the same order), without nn.Linear's throwaway init nor a CPU copy of
    the weights: ``make()`` runs on the meta device. The shared head and the RoPE tables stay
    where they are (``.to(device)`` moves the latter).
    """
    with torch.device("meta"):
        drafter = make()
    drafter.init_weights(seed, device=device)
    return drafter
