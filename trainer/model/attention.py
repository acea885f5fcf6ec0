"""Attention backends for the drafter: ``flex`` (compiled), ``sdpa`` (boolean mask), ``flex-eager``.

All three implement the DFlash visibility of ``trainer.model.blocks.visibility_mask``, one
mask per draft-layer pattern (``build_masks``):

- ``flex``: compiled ``flex_attention`` with a BlockMask built analytically here
  (``flex_block_mask``; no compile, no vmap over Q x KV). Outside a compiled region the
  caller passes the compiled function in (``flex=``; the process's
  trainer.compile.registry.CompileRegistry compiles it once): this module compiles nothing.
- ``sdpa``: ``scaled_dot_product_attention`` with a dense boolean mask; rows that see
  nothing (invalid blocks) give zeros, never NaN (forward or backward). No compile.
- ``flex-eager``: uncompiled flex_attention, which materializes the full score matrix
  (6-10x slower, 15-25x the memory on an H200). Only as an explicit debug choice; warns
  (``EagerFlex``: once per instance; the process holds one, trainer.core.runtime.Runtime).

``build_mask(backend, ...)`` returns the backend's mask object; ``attend(backend, q, k, v,
mask, flex=...)`` runs attention. Both are cheap to call inside or outside a compiled region.
"""

from __future__ import annotations

import logging
import warnings

import torch
import torch.nn.functional as F

from .blocks import visibility_mask

log = logging.getLogger("dfo")
FLEX_BLOCK = 128
BACKENDS = ("flex", "sdpa", "flex-eager")


def _mask_mod_for(anchors: torch.Tensor, valid: torch.Tensor, seq_len: int, block_size: int,
                  window: int = 0, causal: bool = False, ctx_lo: torch.Tensor | None = None):
    n = anchors.shape[1]
    anch = torch.where(valid, anchors, torch.zeros_like(anchors))
    if ctx_lo is not None:
        return _packed_mask_mod(anch, valid, ctx_lo, n, seq_len, block_size, window, causal)

    def dflash_mask_mod(b, h, q_idx, kv_idx):
        blk = q_idx // block_size
        safe = blk.clamp(max=n - 1)
        a = anch[b, safe]
        ok = valid[b, safe] & (blk < n)
        ctx = kv_idx < a
        own = (kv_idx >= seq_len) & ((kv_idx - seq_len) // block_size == blk)
        return ok & (ctx | own)

    def layer_mask_mod(b, h, q_idx, kv_idx):
        blk, off = q_idx // block_size, q_idx % block_size
        safe = blk.clamp(max=n - 1)
        a = anch[b, safe]
        ok = valid[b, safe] & (blk < n)
        ctx = kv_idx < a
        if window > 0:
            ctx = ctx & (kv_idx >= a + off - (window - 1))
        own = (kv_idx >= seq_len) & ((kv_idx - seq_len) // block_size == blk)
        if causal:
            own = own & ((kv_idx - seq_len) % block_size <= off)
        return ok & (ctx | own)
    return layer_mask_mod if (window > 0 or causal) else dflash_mask_mod


def _packed_mask_mod(anch, valid, ctx_lo, n: int, seq_len: int, block_size: int, window: int,
                     causal: bool):
    """The mask_mod of a packed row: a block's context starts at its sample's first token."""
    lo_of = torch.where(valid, ctx_lo, torch.zeros_like(ctx_lo))

    def packed_mask_mod(b, h, q_idx, kv_idx):
        blk, off = q_idx // block_size, q_idx % block_size
        safe = blk.clamp(max=n - 1)
        a = anch[b, safe]
        ok = valid[b, safe] & (blk < n)
        ctx = (kv_idx < a) & (kv_idx >= lo_of[b, safe])
        if window > 0:
            ctx = ctx & (kv_idx >= a + off - (window - 1))
        own = (kv_idx >= seq_len) & ((kv_idx - seq_len) // block_size == blk)
        if causal:
            own = own & ((kv_idx - seq_len) % block_size <= off)
        return ok & (ctx | own)
    return packed_mask_mod


def flex_block_mask(anchors: torch.Tensor, valid: torch.Tensor, seq_len: int, block_size: int,
                    *, block: int = FLEX_BLOCK, window: int = 0, causal: bool = False,
                    ctx_lo: torch.Tensor | None = None):
    """The DFlash BlockMask, from interval arithmetic (exact; no dense Q x KV materialization).

    Each query row sees two intervals: context [0, anchor) and its own block
    [S + n*B, S + (n+1)*B) (with ``window``: context [anchor+k-(window-1), anchor) for
    slot k; ``causal``: [S + n*B, S + n*B + k + 1) of its block; ``ctx_lo`` [b, N], packed
    rows: the context starts no earlier than its sample's first token). Counting the visible
    keys of every (row, KV tile) gives which tiles are empty, partial or full; partial tiles
    use the mask_mod.
    """
    from torch.nn.attention.flex_attention import BlockMask

    b, n = anchors.shape
    dev = anchors.device
    tq, kv = n * block_size, seq_len + n * block_size
    nqb, nkb = -(-tq // block), -(-kv // block)
    rows = torch.arange(nqb * block, device=dev)
    in_range = rows < tq
    blk = (rows // block_size).clamp(max=n - 1)
    ok = valid[:, blk] & in_range                                           # [b, Rq]
    a = torch.where(ok, anchors[:, blk], torch.zeros_like(anchors[:, blk]))  # [b, Rq]
    kb_lo = torch.arange(nkb, device=dev) * block
    kb_hi = (kb_lo + block).clamp(max=kv)
    width = (kb_hi - kb_lo).view(1, 1, -1)
    off = rows % block_size
    lo = (a + off.view(1, -1) - (window - 1)).clamp(min=0) if window > 0 else torch.zeros_like(a)
    if ctx_lo is not None:
        lo = torch.maximum(lo, torch.where(ok, ctx_lo[:, blk], torch.zeros_like(lo)))
    ctx_cnt = (torch.minimum(a.unsqueeze(-1), kb_hi.view(1, 1, -1))
               - torch.maximum(lo.unsqueeze(-1), kb_lo.view(1, 1, -1))).clamp(min=0)
    own_lo = (seq_len + blk * block_size).view(1, -1, 1)
    own_hi = own_lo + ((off + 1).view(1, -1, 1) if causal else block_size)
    own_cnt = (torch.minimum(own_hi, kb_hi.view(1, 1, -1)) - torch.maximum(own_lo, kb_lo.view(1, 1, -1))
               ).clamp(min=0) * ok.unsqueeze(-1)
    cnt = (ctx_cnt + own_cnt).view(b, nqb, block, nkb)
    rows_ok = in_range.view(1, nqb, block, 1)
    any_ = ((cnt > 0) & rows_ok).any(dim=2)                                  # [b, nqb, nkb]
    # a padding row (past Tq) sees nothing, as in create_block_mask: its tile is partial
    full = ((cnt == width.unsqueeze(1)) & rows_ok).all(dim=2) & any_
    partial = any_ & ~full

    def ordered(m):
        num = m.sum(-1).to(torch.int32)
        idx = torch.argsort(m.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return num.unsqueeze(1), idx.unsqueeze(1)                            # add the head dim

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    mask_mod = _mask_mod_for(anchors, valid, seq_len, block_size, window, causal, ctx_lo)
    try:
        return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block,
                                        mask_mod=mask_mod, seq_lengths=(tq, kv))
    except TypeError:  # older torch without seq_lengths
        return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block,
                                        mask_mod=mask_mod)


def reference_block_mask(anchors, valid, seq_len, block_size, *, block: int = FLEX_BLOCK,
                         window: int = 0, causal: bool = False, ctx_lo=None):
    """The same BlockMask through torch's (uncompiled) create_block_mask; tests/bench only."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, n = anchors.shape
    return create_block_mask(_mask_mod_for(anchors, valid, seq_len, block_size, window, causal,
                                           ctx_lo), b, None,
                             n * block_size, seq_len + n * block_size, device=anchors.device,
                             BLOCK_SIZE=block)


class SdpaMask:
    """Dense boolean mask [b,1,Tq,KV] made safe for rows that see nothing, plus those rows."""

    def __init__(self, visible: torch.Tensor):
        row_any = visible.any(dim=-1, keepdim=True)                          # [b, Tq, 1]
        self.safe = (visible | ~row_any).unsqueeze(1)                        # [b, 1, Tq, KV]
        self.row_any = row_any.unsqueeze(1)                                  # [b, 1, Tq, 1]


def build_mask(backend: str, anchors: torch.Tensor, valid: torch.Tensor, seq_len: int,
               block_size: int, window: int = 0, causal: bool = False,
               ctx_lo: torch.Tensor | None = None):
    """The mask object ``attend`` needs for ``backend``, for one layer's pattern (``window``
    > 0: a sliding layer; ``causal``: causal within the block; ``ctx_lo`` [b, N], packed
    rows: each block's sample's first token)."""
    if backend == "sdpa":
        return SdpaMask(visibility_mask(anchors, valid, seq_len, block_size, window, causal,
                                        ctx_lo))
    if backend in ("flex", "flex-eager"):
        return flex_block_mask(anchors, valid, seq_len, block_size, window=window, causal=causal,
                               ctx_lo=ctx_lo)
    raise ValueError(f"unknown attention backend {backend!r} (expected one of {BACKENDS})")


def build_masks(backend: str, anchors: torch.Tensor, valid: torch.Tensor, seq_len: int,
                block_size: int, pattern, ctx_lo: torch.Tensor | None = None) -> tuple:
    """One mask per draft layer of ``pattern`` (``LayerAttention``s); layers of one pattern
    share one mask object, so a uniform drafter builds one mask."""
    made: dict = {}
    for la in pattern:
        if la not in made:
            made[la] = build_mask(backend, anchors, valid, seq_len, block_size, la.window,
                                  la.causal, ctx_lo)
    return tuple(made[la] for la in pattern)


def layer_attends(backend: str, masks, flex=None) -> list:
    """The per-layer ``attend(q, k, v)`` callables the drafter's forward takes (``flex``: as
    for ``attend``)."""
    return [lambda q, k, v, m=m: attend(backend, q, k, v, m, flex=flex) for m in masks]


def _sdpa(q, k, v, mask: SdpaMask):
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.safe)
    return torch.where(mask.row_any, out, torch.zeros_like(out))


class EagerFlex:
    """Uncompiled flex_attention, the ``flex-eager`` backend's ``flex``: warns on its first
    call (one instance per process gives the warning once)."""

    WARNING = ("model.attention=flex-eager: uncompiled flex_attention materializes the full "
               "score matrix (6-10x slower, 15-25x the memory); use it only to debug")

    def __init__(self):
        self.warned = False

    def __call__(self, q, k, v, block_mask, *, enable_gqa: bool = False):
        if not self.warned:
            self.warned = True
            warnings.warn(self.WARNING, stacklevel=3)
            log.warning(self.WARNING)
        from torch.nn.attention.flex_attention import flex_attention as _flex

        return _flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


def attend(backend: str, q, k, v, mask, *, flex=None):
    """Attention of block queries q [b,h,Tq,d] over k/v [b,hkv,KV,d] -> [b,h,Tq,d].

    ``flex``: for the ``flex`` backend outside a compiled region, the compiled
    ``flex(q, k, v, block_mask, *, enable_gqa)`` to call
    (trainer.compile.registry.CompileRegistry.flex_attention); never the dense eager path.
    For ``flex-eager``, the process's ``EagerFlex`` (None: one for this call, which warns)."""
    gqa = k.shape[1] != q.shape[1]
    if backend == "sdpa":
        return _sdpa(q, k, v, mask)
    if backend == "flex":
        if torch.compiler.is_compiling():  # inside a compiled region: inductor fuses it
            from torch.nn.attention.flex_attention import flex_attention as _flex

            return _flex(q, k, v, block_mask=mask, enable_gqa=gqa)
        if flex is None:
            raise ValueError("attention backend 'flex' outside a compiled region needs the "
                             "compiled flex_attention (flex=CompileRegistry.flex_attention)")
        return flex(q, k, v, mask, enable_gqa=gqa)
    if backend == "flex-eager":
        return (flex if flex is not None else EagerFlex())(q, k, v, mask, enable_gqa=gqa)
    raise ValueError(f"unknown attention backend {backend!r} (expected one of {BACKENDS})")
