"""Model FLOPs of a drafter training step and of the target's forward (for MFU), and the peak.

MFU = model FLOPs / time / peak; the formulas are in docs/trainer.md. ``drafter_flops``
counts DFlash's step, and DFlash2's when given its ``DFlash2Spec`` (the grouped dynamic
convolutions and the path selector on top; each layer's pattern enters through the visible
pairs, ``pattern_pairs``).
"""

from __future__ import annotations

import torch

from ..model.dflash2 import dflash2_extra_flops

#: H200 bf16 dense, from the datasheet (TFLOP/s): the default peak on a GPU
H200_BF16_PEAK_TFLOPS = 989.0


def visible_pairs(anchors: torch.Tensor, valid: torch.Tensor, block_size: int,
                  window: int = 0, causal: bool = False) -> int:
    """Sum over valid block queries of the keys they see (``blocks.visibility_mask``'s count)
    in one layer of that pattern.

    Slot k sees ``anchor`` context keys (a sliding window w >= B: ``min(anchor, w-1-k)``) and
    its whole block (causal: the k+1 slots up to itself)."""
    k = torch.arange(block_size, device=anchors.device)
    ctx = anchors.unsqueeze(-1).expand(*anchors.shape, block_size)
    if window > 0:
        ctx = torch.minimum(ctx, (window - 1 - k).clamp(min=0))            # [b, N, B]
    own = block_size * (block_size + 1) // 2 if causal else block_size * block_size
    per_block = ctx.sum(-1) + own
    return int((per_block * valid).sum())


def pattern_pairs(anchors: torch.Tensor, valid: torch.Tensor, block_size: int, pattern) -> int:
    """``visible_pairs`` averaged over the draft layers' patterns (rounded down)."""
    total = sum(visible_pairs(anchors, valid, block_size, la.window, la.causal) for la in pattern)
    return total // max(1, len(pattern))


def drafter_flops(spec, *, seq_len: int, tq: int, pairs: int, label_rows: int, d2=None,
                  extra: dict | None = None) -> dict:
    """Model FLOPs of one drafter step (forward + backward) for one micro-batch.

    Linear layers: 2*m*n*k forward, 2x that backward (input + weight grads) -> 6*m*n*k;
    fc: forward + weight grad only (its input is the frozen target's features) -> 4*m*n*k.
    Attention: 4*heads*head_dim per visible (query, key) pair forward, 3x for fwd+bwd.
    LM head (frozen): forward + grad w.r.t. the hidden state only -> 4*rows*H*V (DFlash2's
    capped unary logits: the same matmuls). ``d2`` (a ``DFlash2Spec``): DFlash2's step,
    adding ``dflash2_extra_flops``; its ``pairs`` are the sliding window's. ``extra``: a
    method's own terms (``DrafterMethod.extra_flops``), added to the total.
    ``tq``/``pairs``/``label_rows`` are summed over the micro-batch's sequences.
    """
    h, nh, nkv, hd, inter = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.intermediate
    b_seq = seq_len  # context rows (already times batch by the caller)
    fc = 4 * b_seq * (spec.num_taps * h) * h
    lin = 6 * (tq * h * nh * hd + 2 * (b_seq + tq) * h * nkv * hd + tq * nh * hd * h + 3 * tq * h * inter)
    attn = 3 * 4 * nh * hd * pairs
    head = 4 * label_rows * h * spec.vocab
    layers = spec.num_layers * (lin + attn)
    out = {"fc": fc, "layers": layers, "attention": spec.num_layers * attn, "lm_head": head}
    if d2 is not None and extra is None:
        extra = dflash2_extra_flops(spec, d2, tq=tq, label_rows=label_rows)
    out.update(extra or {})
    out["total"] = fc + layers + head + sum((extra or {}).values())
    return out


def target_flops(tcfg, *, layers_run: int, seq_len: int, batch: int) -> int:
    """Forward FLOPs of the target up to the last tapped layer (causal attention)."""
    h = tcfg.hidden_size
    nh = tcfg.num_attention_heads
    nkv = getattr(tcfg, "num_key_value_heads", nh)
    hd = getattr(tcfg, "head_dim", None) or h // nh
    inter = tcfg.intermediate_size
    lin = 2 * seq_len * (h * nh * hd + 2 * h * nkv * hd + nh * hd * h + 3 * h * inter)
    attn = 4 * nh * hd * seq_len * (seq_len + 1) // 2
    return batch * layers_run * (lin + attn)
