"""Model FLOPs of a drafter training step and of the target's forward (for MFU), and the peak.

MFU = model FLOPs / time / peak; the formulas are in docs/trainer.md.
"""

from __future__ import annotations

import torch

#: H200 bf16 dense, from the datasheet (TFLOP/s): the default peak on a GPU
H200_BF16_PEAK_TFLOPS = 989.0


def visible_pairs(anchors: torch.Tensor, valid: torch.Tensor, block_size: int) -> int:
    """Sum over valid block queries of the keys they see: B * (anchor + B) per valid block."""
    return int((block_size * (anchors + block_size) * valid).sum())


def drafter_flops(spec, *, seq_len: int, tq: int, pairs: int, label_rows: int) -> dict:
    """Model FLOPs of one drafter step (forward + backward) for one micro-batch.

    Linear layers: 2*m*n*k forward, 2x that backward (input + weight grads) -> 6*m*n*k;
    fc: forward + weight grad only (its input is the frozen target's features) -> 4*m*n*k.
    Attention: 4*heads*head_dim per visible (query, key) pair forward, 3x for fwd+bwd.
    LM head (frozen): forward + grad w.r.t. the hidden state only -> 4*rows*H*V.
    ``tq``/``pairs``/``label_rows`` are summed over the micro-batch's sequences.
    """
    h, nh, nkv, hd, inter = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.intermediate
    b_seq = seq_len  # context rows (already times batch by the caller)
    fc = 4 * b_seq * (spec.num_taps * h) * h
    lin = 6 * (tq * h * nh * hd + 2 * (b_seq + tq) * h * nkv * hd + tq * nh * hd * h + 3 * tq * h * inter)
    attn = 3 * 4 * nh * hd * pairs
    head = 4 * label_rows * h * spec.vocab
    layers = spec.num_layers * (lin + attn)
    return {"fc": fc, "layers": layers, "attention": spec.num_layers * attn, "lm_head": head,
            "total": fc + layers + head}


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
