"""Packed rows: whole samples laid end to end in rows of one fixed shape (``data.pack``).

A row holds ``tokens`` tokens and ``anchors`` anchor slots (``TrainerConfig.pack_row``).
Samples are taken in the stream's seeded order (trainer.data.stream.Order) and placed
greedily: the next sample joins the current row while both its tokens and its anchors fit,
else it opens the next row; a micro-batch is ``micro_batch`` rows, and the sample that does
not fit its last row opens the next micro-batch. A sample is never split, so a micro-batch
is a pure function of the sample position it starts at, the seed and its index, and resume
needs only (micro-batch index, sample position).

Each sample keeps what it has unpacked:

- **positions** restart at its first token (``Batch.position_ids``), so the target attends
  block-diagonally causal, each sample inside itself (trainer.model.target.Target.features),
  and RoPE sees the positions the sample has alone;
- **anchors** are drawn per sample with the rule of trainer.model.blocks.sample_anchors
  (up to ``num_anchors`` from its eligible positions), and each carries its sample's token
  range ``[doc_lo, doc_hi)``: a block sees context only from its own sample (sliding windows
  are cut there too) and predicts no label past the sample's end;
- so its loss terms, weights and metrics are those of the sample alone.

The row's tail after its last sample is padding (``Batch.padding``): pad tokens with
positions of their own, and invalid anchor slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dfo_contract.exitcodes import DataError

from .collate import anchor_seed
from .formats import Sample


@dataclass(frozen=True)
class RowShape:
    """A packed row's fixed size: tokens and anchor slots."""

    tokens: int
    anchors: int


def anchor_need(loss_mask, num_anchors: int) -> int:
    """Anchors a sample gets (alone or packed): its eligible positions (p <= len-2 with
    ``loss_mask[p] and loss_mask[p+1]``, trainer.model.blocks.eligible_anchors), at most
    ``num_anchors``."""
    lm = np.asarray(loss_mask, dtype=bool)
    if lm.size < 2:
        return 0
    return int(min(num_anchors, int(np.count_nonzero(lm[:-1] & lm[1:]))))


def plan_rows(costs, rows: int, shape: RowShape) -> tuple[list[list[int]], int]:
    """Greedy placement of the next samples into ``rows`` rows of ``shape``.

    ``costs`` yields (tokens, anchors) of the samples in order. Returns the rows (each a list of
    offsets into ``costs``) and how many samples they hold; the first sample that does not fit
    the last row is left for the next call."""
    out: list[list[int]] = [[]]
    used_t = used_a = 0
    taken = 0
    for k, (t, a) in enumerate(costs):
        if t > shape.tokens or a > shape.anchors:
            raise DataError(f"data: a sample of {t} tokens and {a} anchors does not fit a packed "
                            f"row of {shape.tokens} tokens and {shape.anchors} anchors; raise "
                            "--data.pack_tokens / --data.pack_anchors")
        if used_t + t > shape.tokens or used_a + a > shape.anchors:
            if len(out) == rows:
                break
            out.append([])
            used_t = used_a = 0
        out[-1].append(k)
        used_t += t
        used_a += a
        taken = k + 1
    while len(out) < rows:
        out.append([])
    return out, taken


def pack_rows(rows: list[list[Sample]], *, shape: RowShape, block_size: int, num_anchors: int,
              seed: int, micro_index: int, pad_id: int = 0):
    """The ``Batch`` of packed rows ``rows`` (lists of whole samples) and its anchors.

    Each sample's anchors come from one generator seeded by (seed, micro_index), drawn
    sample after sample in row order."""
    import torch

    from ..model.blocks import sample_anchors
    from .batch import Batch

    r, t, n = len(rows), shape.tokens, shape.anchors
    ids = torch.full((r, t), pad_id, dtype=torch.long)
    lm = torch.zeros((r, t), dtype=torch.bool)
    pos = torch.zeros((r, t), dtype=torch.long)
    anchors = torch.zeros((r, n), dtype=torch.long)
    valid = torch.zeros((r, n), dtype=torch.bool)
    lo = torch.zeros((r, n), dtype=torch.long)
    hi = torch.zeros((r, n), dtype=torch.long)
    used = torch.zeros(r, dtype=torch.long)
    g = torch.Generator(device="cpu").manual_seed(anchor_seed(seed, micro_index))
    docs = 0
    for i, row in enumerate(rows):
        at = na = 0
        for s in row:
            length = len(s.input_ids)
            x = torch.as_tensor(np.asarray(s.input_ids, dtype=np.int64))
            m = torch.as_tensor(np.asarray(s.loss_mask, dtype=bool))
            ids[i, at:at + length] = x
            lm[i, at:at + length] = m
            pos[i, at:at + length] = torch.arange(length)
            a, v = sample_anchors(m.view(1, -1), torch.tensor([length]), num_anchors, block_size,
                                  generator=g)
            k = int(v.sum())
            anchors[i, na:na + k] = a[0, :k] + at
            valid[i, na:na + k] = True
            lo[i, na:na + k] = at
            hi[i, na:na + k] = at + length
            at += length
            na += k
            docs += 1
        # the tail: positions of its own (a boundary for the target's packed-sequence mask)
        pos[i, at:] = torch.arange(t - at)
        used[i] = at
    return Batch(input_ids=ids, loss_mask=lm, lengths=used, anchors=anchors, anchor_valid=valid,
                 num_tokens=int(used.sum()), num_samples=docs, position_ids=pos, doc_lo=lo,
                 doc_hi=hi)
