"""The DFlash block geometry: anchors, block inputs, RoPE positions, visibility.

Shapes: b sequences of (padded) length S; N anchor slots per sequence; block size B;
Tq = N*B block tokens; KV = S + Tq (context | blocks).

- **Anchors.** Per sequence, up to N positions drawn uniformly without replacement from
  ``p <= len-2`` with ``loss_mask[p] and loss_mask[p+1]`` (as SpecForge: up to the
  second-to-last loss token; a block running past the sample's end is padded, and its slots
  at or after ``len`` carry no loss); sorted; unused slots invalid (anchor 0, valid False).
- **Block input.** ``[x_anchor, MASK x (B-1)]`` (an invalid block is all MASK).
- **Visibility.** Query slot k of block n sees context ``j < anchor_n`` (strictly) and its
  own block (bidirectional), nothing else. Invalid blocks see nothing. Sliding-window
  and causal layers see less: see ``visibility_mask``.

What the blocks are trained to predict, and the loss, are trainer.core.objective's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


# --------------------------------------------------------------------------- anchors

def eligible_anchors(loss_mask: torch.Tensor, lengths: torch.Tensor, block_size: int) -> torch.Tensor:
    """Bool [b, S]: positions that may be anchors (p <= len-2, loss_mask[p] & loss_mask[p+1]).

    ``block_size`` is accepted for interface stability; blocks near the end are padded
    (their labels at or after ``len`` are masked in ``labels_and_weights``)."""
    b, s = loss_mask.shape
    lm = loss_mask.bool()
    nxt = torch.zeros_like(lm)
    nxt[:, :-1] = lm[:, 1:]
    pos = torch.arange(s, device=loss_mask.device).unsqueeze(0)
    return lm & nxt & (pos <= (lengths.view(-1, 1) - 2))


def sample_anchors(loss_mask: torch.Tensor, lengths: torch.Tensor, num_anchors: int,
                   block_size: int, generator: torch.Generator | None = None):
    """Up to ``num_anchors`` sorted anchors per row, uniformly without replacement.

    Returns ``anchors`` [b, N] (long; 0 where invalid) and ``valid`` [b, N] (bool).
    """
    elig = eligible_anchors(loss_mask, lengths, block_size)
    b, s = elig.shape
    keys = torch.rand(b, s, generator=generator, device=elig.device)
    keys = torch.where(elig, keys, torch.full_like(keys, 2.0))
    n_take = min(num_anchors, s)
    order = torch.argsort(keys, dim=1, stable=True)[:, :n_take]
    counts = elig.sum(dim=1, keepdim=True)
    valid = torch.arange(n_take, device=elig.device).unsqueeze(0) < counts
    anchors = torch.where(valid, order, torch.zeros_like(order))
    # sort valid anchors ascending, invalid slots last
    sort_key = torch.where(valid, anchors, torch.full_like(anchors, s + 1))
    sort_key, idx = torch.sort(sort_key, dim=1, stable=True)
    anchors = torch.gather(anchors, 1, idx)
    valid = torch.gather(valid, 1, idx)
    if n_take < num_anchors:
        pad = num_anchors - n_take
        anchors = F.pad(anchors, (0, pad))
        valid = F.pad(valid, (0, pad))
    return anchors.long(), valid


# --------------------------------------------------------------------------- block inputs

def block_input_ids(input_ids: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor,
                    block_size: int, mask_token_id: int) -> torch.Tensor:
    """[b, N*B]: each block is [x_anchor, MASK, ..., MASK]; invalid blocks all MASK."""
    b, n = anchors.shape
    ids = torch.full((b, n, block_size), mask_token_id, dtype=input_ids.dtype, device=input_ids.device)
    first = torch.gather(input_ids, 1, anchors)
    ids[:, :, 0] = torch.where(valid, first, torch.full_like(first, mask_token_id))
    return ids.view(b, n * block_size)


def block_positions(anchors: torch.Tensor, block_size: int,
                    position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[b, N*B]: RoPE positions anchor+k of block slot k; with ``position_ids`` [b, S] (packed
    rows: each sample's own positions) the anchor's position in its sample, plus k."""
    b, n = anchors.shape
    k = torch.arange(block_size, device=anchors.device).view(1, 1, -1)
    start = anchors if position_ids is None else torch.gather(position_ids, 1, anchors)
    return (start.unsqueeze(-1) + k).view(b, n * block_size)


def visibility_mask(anchors: torch.Tensor, valid: torch.Tensor, seq_len: int,
                    block_size: int, window: int = 0, causal: bool = False,
                    ctx_lo: torch.Tensor | None = None) -> torch.Tensor:
    """Bool [b, N*B, S+N*B]: which keys each block query sees (True = visible).

    One draft layer's pattern (``dfo_contract.trainer_config.layers``): ``window`` > 0
    (a sliding layer) limits slot k (position p = anchor+k) to context
    ``p-(window-1) <= j < anchor``; ``causal`` limits its own block to the slots ``<= k``
    (else the whole block, as a symmetric window of at least a block shows it).
    ``ctx_lo`` [b, N] (packed rows): block n's context starts at its sample's first token."""
    b, n = anchors.shape
    tq = n * block_size
    q_idx = torch.arange(tq, device=anchors.device)
    q_blk, q_off = q_idx // block_size, q_idx % block_size                 # [Tq]
    kv = torch.arange(seq_len + tq, device=anchors.device)                 # [KV]
    a = anchors[:, q_blk]                                                  # [b, Tq]
    ok = valid[:, q_blk]                                                   # [b, Tq]
    ctx = kv.view(1, 1, -1) < a.unsqueeze(-1)                              # j < anchor (j < S too)
    kv_blk = torch.where(kv >= seq_len, (kv - seq_len) // block_size, torch.full_like(kv, -1))
    own = kv_blk.view(1, 1, -1) == q_blk.view(1, -1, 1)
    if window > 0:
        lo = (a + q_off.view(1, -1) - (window - 1)).unsqueeze(-1)
        ctx = ctx & (kv.view(1, 1, -1) >= lo)
    if ctx_lo is not None:
        ctx = ctx & (kv.view(1, 1, -1) >= ctx_lo[:, q_blk].unsqueeze(-1))
    if causal:
        own = own & (((kv - seq_len) % block_size).view(1, 1, -1) <= q_off.view(1, -1, 1))
    return (ctx | own) & ok.unsqueeze(-1)
