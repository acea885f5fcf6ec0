"""The DFlash2 drafter's architecture: the DFlash drafter plus two additions (no loss here).

- **Grouped dynamic depthwise convolution** around every attention and MLP sublayer
  (``attention_conv``, ``mlp_conv``). One projection of the (normed) sublayer input gives,
  per block slot, a dynamic coefficient per tap for each group of ``conv_group_size``
  channels, twice: once for the sublayer's input, once for its output. Slot i's output is
  ``sum_t (base[side, t] + delta_i[side, t]) * x_{i-t}``, reading only earlier slots of the
  same block (zeros before the block's start). ``base_kernel`` [2, taps, H] starts as the
  identity (tap 0 = 1) and ``kernel_projection`` at zero, so a fresh DFlash2 layer computes
  exactly what a DFlash layer does.
- **Top-k pairwise path selector** (``candidate_selector``): the unary logits of slot k
  (``cap * tanh(lm_head(h_k) * output_multiplier / cap)``) give the top-k candidates;
  a candidate c following token p at slot k scores
  ``unary_k(c) + <predecessor_codebook[p] * hidden_projection(h_k), successor_codebook[c]>``.
  Slot 1's predecessor is the anchor token. The served draft walks slots greedily.
  ``successor_codebook`` starts at zero (the selector starts as the unary argmax).
- Sliding-window attention in the draft layers by default (``model.layer_types``; the
  visibility of ``trainer.model.blocks.visibility_mask(..., window, causal)``), bidirectional
  within the block as the released checkpoints and the engines serve it.

Parameter names are the DFlash2 checkpoints' (``layers.N.attention_conv.base_kernel``,
``layers.N.mlp_conv.kernel_projection.weight``, ``candidate_selector.successor_codebook``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .drafter import Attend, Drafter, DrafterLayer, DrafterSpec, SharedHead


@dataclass(frozen=True)
class DFlash2Spec:
    block_size: int
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16
    final_logit_softcapping: float = 20.0
    output_multiplier: float = 1.0

    @classmethod
    def from_settings(cls, block_size: int, s) -> "DFlash2Spec":
        """The spec of ``model.block_size`` and the config's ``DFlash2Settings`` ``s``."""
        return cls(block_size=block_size, conv_kernel_size=s.conv_kernel_size,
                   conv_group_size=s.conv_group_size, selector_rank=s.selector_rank,
                   selector_top_k=s.selector_top_k,
                   final_logit_softcapping=s.final_logit_softcapping,
                   output_multiplier=s.output_multiplier)

    def problem(self, hidden: int, vocab: int) -> tuple[str, str] | None:
        """(flag, why) when this spec does not fit a target of width ``hidden``/``vocab``."""
        if hidden % self.conv_group_size:
            return ("model.conv_group_size", f"{self.conv_group_size} does not divide the "
                                             f"target's hidden size {hidden}")
        if self.selector_top_k > vocab:
            return ("model.selector_top_k", f"{self.selector_top_k} exceeds the target's "
                                            f"vocabulary ({vocab})")
        return None


class GroupedDynamicConv(nn.Module):
    """The two-sided dynamic depthwise convolution along each block (see the module doc)."""

    def __init__(self, hidden: int, block_size: int, taps: int, group_size: int):
        super().__init__()
        self.block_size, self.taps, self.group_size = block_size, taps, group_size
        self.groups = hidden // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * taps * self.groups, bias=False)

    @torch.no_grad()
    def reset(self) -> None:
        self.base_kernel.zero_()
        self.base_kernel[:, 0] = 1.0
        self.kernel_projection.weight.zero_()

    def convolve(self, x: torch.Tensor, delta: torch.Tensor, side: int) -> torch.Tensor:
        b, t, h = x.shape
        n, bs, g = t // self.block_size, self.block_size, self.groups
        xs = x.reshape(b, n, bs, g, self.group_size)
        coef = (self.base_kernel[side].to(x.dtype).view(1, 1, 1, self.taps, g, self.group_size)
                + delta.reshape(b, n, bs, self.taps, g).unsqueeze(-1))
        out = coef[:, :, :, 0] * xs
        for tap in range(1, self.taps):
            shifted = F.pad(xs[:, :, :bs - tap], (0, 0, 0, 0, tap, 0))   # zeros before the block
            out = out + coef[:, :, :, tap] * shifted
        return out.reshape(b, t, h)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sublayer's convolved input, and the output side's dynamic coefficients."""
        d = self.kernel_projection(x).reshape(*x.shape[:-1], 2, self.taps, self.groups)
        return self.convolve(x, d[..., 0, :, :], 0), d[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.convolve(y, delta, 1)


class DFlash2Layer(DrafterLayer):
    def __init__(self, s: DrafterSpec, d: DFlash2Spec):
        super().__init__(s)
        self.attention_conv = GroupedDynamicConv(s.hidden, d.block_size, d.conv_kernel_size,
                                                 d.conv_group_size)
        self.mlp_conv = GroupedDynamicConv(s.hidden, d.block_size, d.conv_kernel_size,
                                           d.conv_group_size)

    def forward(self, x, ctx, rope_q, rope_k, attend: Attend):
        h, d = self.attention_conv.prepare(self.input_layernorm(x))
        x = x + self.attention_conv.finish(self.self_attn(h, ctx, rope_q, rope_k, attend), d)
        h, d = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(h), d)


class CandidateSelector(nn.Module):
    def __init__(self, hidden: int, vocab: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def transition(self, hidden: torch.Tensor, pred_ids: torch.Tensor,
                   cand_ids: torch.Tensor) -> torch.Tensor:
        """[..., K]: the pairwise term of candidates ``cand_ids`` [..., K] after ``pred_ids`` [...]."""
        ctx = self.predecessor_codebook[pred_ids] * self.hidden_projection(hidden)
        succ = self.successor_codebook[cand_ids].to(ctx.dtype)
        return torch.einsum("...r,...kr->...k", ctx, succ)


class DFlash2Drafter(Drafter):
    """The DFlash2 drafter. ``forward`` returns the final hidden states of the block tokens."""

    method = "dflash2"
    selector_alpha: torch.Tensor     # a buffer (set in __init__)

    def __init__(self, spec: DrafterSpec, d2: DFlash2Spec, shared: SharedHead):
        super().__init__(spec, shared)
        self.d2 = d2
        self.layers = nn.ModuleList(DFlash2Layer(spec, d2) for _ in range(spec.num_layers))
        self.candidate_selector = CandidateSelector(spec.hidden, spec.vocab, d2.selector_rank,
                                                    d2.selector_top_k)
        # the selector loss weight of this step (trainer.core.objective_dflash2.selector_alpha_at):
        # a tensor, so a changing weight never recompiles the step
        self.register_buffer("selector_alpha", torch.ones(()), persistent=False)

    def set_selector_alpha(self, alpha: float) -> None:
        if self.selector_alpha.is_meta:
            self.selector_alpha = torch.full((), float(alpha))
        else:
            self.selector_alpha.fill_(float(alpha))

    def freeze_selector(self) -> None:
        """A selector loss weight of 0: the selector's parameters are not trained."""
        self.candidate_selector.requires_grad_(False)

    @torch.no_grad()
    def init_weights(self, seed: int, device=None) -> None:
        """The DFlash init, then the no-op starts: identity convs, a zero successor codebook."""
        super().init_weights(seed, device)
        if self.selector_alpha.is_meta:
            self.selector_alpha = torch.ones((), device=device if device is not None else "cpu")
        for layer in self.layers:
            layer.attention_conv.reset()
            layer.mlp_conv.reset()
        self.candidate_selector.successor_codebook.zero_()

    def unary_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The served unary transform, in fp32: ``cap * tanh(logits * multiplier / cap)``."""
        cap = self.d2.final_logit_softcapping
        return torch.tanh(logits.float() * (self.d2.output_multiplier / cap)) * cap

    @torch.no_grad()
    def greedy_path(self, hidden: torch.Tensor, anchor_ids: torch.Tensor) -> torch.Tensor:
        """[b, N, B-1]: the served draft of each block, walking the selector slot by slot.

        hidden [b, N, B, H] (slot 0 = the anchor's row, unused); anchor_ids [b, N]."""
        w = self.shared.lm_head.weight
        hs = hidden[:, :, 1:]
        unary = self.unary_logits(hs.to(w.dtype) @ w.t())
        vals, ids = unary.topk(self.d2.selector_top_k, dim=-1)           # [b, N, B-1, K]
        sel = self.candidate_selector
        prev, path = anchor_ids, []
        for k in range(hs.shape[2]):
            score = vals[:, :, k] + sel.transition(hs[:, :, k].float(), prev, ids[:, :, k]).float()
            prev = ids[:, :, k].gather(-1, score.argmax(-1, keepdim=True)).squeeze(-1)
            path.append(prev)
        return torch.stack(path, dim=2)


def build_dflash2(spec: DrafterSpec, d2: DFlash2Spec, shared: SharedHead) -> DFlash2Drafter:
    """The DFlash2 drafter for ``spec``; a config that does not fit the target is a config error."""
    from dfo_contract.exitcodes import TrainerConfigError

    bad = d2.problem(spec.hidden, spec.vocab)
    if bad:
        raise TrainerConfigError(f"config: --{bad[0]}: {bad[1]}")
    return DFlash2Drafter(spec, d2, shared)


def dflash2_extra_flops(spec, d2, *, tq: int, label_rows: int) -> dict:
    """DFlash2's modules on top of DFlash's, forward + backward, per micro-batch.

    Per layer, two grouped dynamic convolutions (attention and MLP sublayers), each: the
    coefficient projection H -> 2*taps*G (G = H / group size), a linear: 6*Tq*H*2*taps*G;
    the depthwise convolution on both sides of the sublayer, one multiply-add per tap per
    channel per row (2*taps*Tq*H each side forward; backward to the input and the
    coefficients 2x forward): 3 * 2 * 2*taps*Tq*H.
    Selector, per label row (R rows, K candidates, rank r): the candidates' unary logits
    (frozen head rows gathered; forward + gradient to the hidden state) 4*K*H; the hidden
    projection H -> r (a linear) 6*H*r; the predecessor-codebook product r (forward; 2r
    backward) 3*r; the pairwise scores against K successor codes 3 * 2*K*r.
    """
    h, taps = spec.hidden, d2.conv_kernel_size
    groups = h // d2.conv_group_size
    proj = 6 * tq * h * 2 * taps * groups
    depthwise = 3 * 2 * (2 * taps * tq * h)
    conv = spec.num_layers * 2 * (proj + depthwise)
    k, r = d2.selector_top_k, d2.selector_rank
    selector = label_rows * (4 * k * h + 6 * h * r + 3 * r + 3 * 2 * k * r)
    return {"conv": conv, "selector": selector}
