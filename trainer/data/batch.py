"""``Batch``: one micro-batch padded into a shape bucket (made by data, consumed by step)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Batch:
    """One micro-batch, padded into a shape bucket. ``shape == (seq_len, num_anchors)``."""

    input_ids: torch.Tensor      # [b, S] long
    loss_mask: torch.Tensor      # [b, S] bool
    lengths: torch.Tensor        # [b] long (real lengths before padding)
    anchors: torch.Tensor        # [b, N] long (0 where invalid)
    anchor_valid: torch.Tensor   # [b, N] bool
    num_tokens: int = 0          # real tokens (sum of lengths)
    num_samples: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.input_ids.shape[1]), int(self.anchors.shape[1])

    def to(self, device, non_blocking: bool = False) -> "Batch":
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            kw[f.name] = v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
        return Batch(**kw)
