"""Model FLOPs of a drafter training step and of the target's forward (for MFU), and the peak.

MFU = model FLOPs / time / peak; the formulas are in docs/trainer.md. ``drafter_flops``
counts DFlash's step, and DFlash2's when given its ``DFlash2Spec`` (the grouped dynamic
convolutions and the path selector on top; each layer's pattern enters through the visible
pairs, ``pattern_pairs``).
"""

from __future__ import annotations

import torch

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


def drafter_flops(spec, *, seq_len: int, tq: int, pairs: int, label_rows: int, d2=None) -> dict:
    """Model FLOPs of one drafter step (forward + backward) for one micro-batch.

    Linear layers: 2*m*n*k forward, 2x that backward (input + weight grads) -> 6*m*n*k;
    fc: forward + weight grad only (its input is the frozen target's features) -> 4*m*n*k.
    Attention: 4*heads*head_dim per visible (query, key) pair forward, 3x for fwd+bwd.
    LM head (frozen): forward + grad w.r.t. the hidden state only -> 4*rows*H*V (DFlash2's
    capped unary logits: the same matmuls). ``d2`` (a ``DFlash2Spec``): DFlash2's step,
    adding ``dflash2_extra_flops``; its ``pairs`` are the sliding window's.
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
    if d2 is not None:
        extra = dflash2_extra_flops(spec, d2, tq=tq, label_rows=label_rows)
        out.update(extra)
        out["total"] = fc + layers + head + extra["conv"] + extra["selector"]
    else:
        out["total"] = fc + layers + head
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
