"""Collation: samples padded into their (seq_len, anchors) shape bucket, anchors drawn.

The buckets (``data.seq_buckets``, ``data.anchor_buckets``) make the set of shapes compiled
code sees finite. Anchors of micro-batch m are drawn with a generator seeded by (seed, m),
so a micro-batch is a pure function of its samples, the seed and its index.
"""

from __future__ import annotations

from dfo_contract.exitcodes import DataError

from .formats import Sample


def pick_bucket(need: int, buckets: list[int], what: str) -> int:
    for b in sorted(buckets):
        if b >= need:
            return b
    raise DataError(f"data: a batch needs {what} {need} > the largest bucket {max(buckets)}")


def anchor_seed(seed: int, micro_index: int) -> int:
    return (int(seed) * 1_000_003 + int(micro_index) * 7919 + 17) % (2**63 - 1)


def collate(samples: list[Sample], *, block_size: int, num_anchors: int, seq_buckets: list[int],
            anchor_buckets: list[int], seed: int, micro_index: int, pad_id: int = 0):
    """Pad a micro-batch into its (seq_len, anchors) bucket and draw its anchors."""
    import torch

    from ..model.blocks import eligible_anchors, sample_anchors
    from .batch import Batch

    lengths = [len(s.input_ids) for s in samples]
    s_len = pick_bucket(max(lengths), seq_buckets, "seq_len")
    b = len(samples)
    ids = torch.full((b, s_len), pad_id, dtype=torch.long)
    lm = torch.zeros((b, s_len), dtype=torch.bool)
    for i, s in enumerate(samples):
        ids[i, : len(s.input_ids)] = torch.tensor(s.input_ids, dtype=torch.long)
        lm[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.bool)
    lens = torch.tensor(lengths, dtype=torch.long)
    need = min(num_anchors, int(eligible_anchors(lm, lens, block_size).sum(1).max()))
    n_bucket = pick_bucket(max(need, 1), anchor_buckets, "anchors")
    g = torch.Generator(device="cpu").manual_seed(anchor_seed(seed, micro_index))
    anchors, valid = sample_anchors(lm, lens, min(num_anchors, n_bucket), block_size, generator=g)
    if anchors.shape[1] < n_bucket:
        pad = n_bucket - anchors.shape[1]
        anchors = torch.nn.functional.pad(anchors, (0, pad))
        valid = torch.nn.functional.pad(valid, (0, pad))
    return Batch(input_ids=ids, loss_mask=lm, lengths=lens, anchors=anchors, anchor_valid=valid,
                 num_tokens=int(sum(lengths)), num_samples=b)
