"""``Batch``: one micro-batch of fixed shape (made by data, consumed by step).

Bucketed (trainer.data.collate): one sample per row, padded into a shape bucket. Packed
(trainer.data.pack): several whole samples per row; ``position_ids`` restart at each
sample's start and every anchor carries its sample's token range ``[doc_lo, doc_hi)``,
which bounds what its block sees and predicts. Bucketed batches leave the three None."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Batch:
    """One micro-batch of fixed shape ``(seq_len, num_anchors)``."""

    input_ids: torch.Tensor      # [b, S] long
    loss_mask: torch.Tensor      # [b, S] bool
    lengths: torch.Tensor        # [b] long (real lengths before padding)
    anchors: torch.Tensor        # [b, N] long (0 where invalid)
    anchor_valid: torch.Tensor   # [b, N] bool
    num_tokens: int = 0          # real tokens (sum of lengths)
    num_samples: int = 0         # samples (documents), packed or not
    position_ids: torch.Tensor | None = None  # [b, S] long: packed, each sample's own positions
    doc_lo: torch.Tensor | None = None        # [b, N] long: packed, the anchor's sample's first token
    doc_hi: torch.Tensor | None = None        # [b, N] long: packed, one past its last token

    @property
    def packed(self) -> bool:
        return self.doc_lo is not None

    @property
    def padding(self) -> int:
        """Pad tokens in this micro-batch (its rows' tokens that belong to no sample)."""
        return int(self.input_ids.numel()) - int(self.num_tokens)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.input_ids.shape[1]), int(self.anchors.shape[1])

    def to(self, device, non_blocking: bool = False) -> "Batch":
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            kw[f.name] = v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
        return Batch(**kw)
