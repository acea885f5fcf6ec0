"""The micro-batch stream of training: ``Order`` (sample position -> dataset index),
``BatchStream`` (deterministic order, one-integer state) and ``SkippedBatch`` (a micro-batch
another ddp rank builds; only its counts).

Order: sample position p (a global counter) maps to epoch ``p // n`` and to index
``perm(seed, epoch)[p % n]``; ``perm`` is a seeded shuffle, so the order is a pure function
of (seed, epoch) and resuming needs only p. The datasets are trainer.data.datasets'.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .collate import collate


class Order:
    """Deterministic sample order by (seed, epoch): position p -> dataset index."""

    def __init__(self, n: int, seed: int, shuffle: bool = True):
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self._cache: dict[int, list[int]] = {}

    def perm(self, epoch: int) -> list[int]:
        p = self._cache.get(epoch)
        if p is None:
            p = list(range(self.n))
            if self.shuffle:
                random.Random(f"dfo-data:{self.seed}:{epoch}").shuffle(p)
            self._cache = {epoch: p}
        return p

    def index(self, position: int) -> tuple[int, int]:
        """(epoch, dataset index) of sample position ``position``."""
        epoch, k = divmod(position, self.n)
        return epoch, self.perm(epoch)[k]


@dataclass(frozen=True)
class SkippedBatch:
    """A micro-batch another ddp rank builds: only what the loop counts (tokens, samples)."""

    num_tokens: int
    num_samples: int


class BatchStream:
    """Micro-batches in a deterministic order; its state is one integer (micro-batches done).

    ``take(n, keep)`` builds only the micro-batches at ``keep`` (this ddp rank's) and skips the
    others: the state advances exactly as ``n`` calls of ``next()`` would, so every rank's data,
    the checkpoint's data state and resume are those of the single loop."""

    def __init__(self, ds, *, micro_batch: int, block_size: int, num_anchors: int,
                 seq_buckets: list[int], anchor_buckets: list[int], seed: int, shuffle: bool = True,
                 pad_id: int = 0):
        self.ds = ds
        self.micro_batch = micro_batch
        self.kw = dict(block_size=block_size, num_anchors=num_anchors, seq_buckets=seq_buckets,
                       anchor_buckets=anchor_buckets, seed=seed, pad_id=pad_id)
        self.order = Order(len(ds), seed, shuffle)
        self.micro_index = 0

    def next(self):
        m = self.micro_index
        samples = []
        for p in range(m * self.micro_batch, (m + 1) * self.micro_batch):
            _, i = self.order.index(p)
            samples.append(self.ds.get(i))
        self.micro_index += 1
        return collate(samples, micro_index=m, **self.kw)

    def skip(self) -> SkippedBatch:
        """Advance past the next micro-batch without collating it (no tensors, no anchors)."""
        m = self.micro_index
        tokens = 0
        for p in range(m * self.micro_batch, (m + 1) * self.micro_batch):
            _, i = self.order.index(p)
            tokens += self._length(i)
        self.micro_index += 1
        return SkippedBatch(num_tokens=tokens, num_samples=self.micro_batch)

    def take(self, n: int, keep=None) -> list:
        """The next ``n`` micro-batches; those whose index (0..n-1) is not in ``keep`` (None:
        all kept) are ``skip()``-ped and come back as ``SkippedBatch``."""
        keep = range(n) if keep is None else set(keep)
        return [self.next() if k in keep else self.skip() for k in range(n)]

    def _length(self, i: int) -> int:
        """Tokens of dataset sample ``i`` after truncation (num_tokens counts these)."""
        lengths = getattr(self.ds, "lengths", None)
        if lengths is not None:  # a records file: lengths noted at the scan, nothing re-read
            return lengths[i]
        store = getattr(self.ds, "store", None)
        if store is not None:  # a tokenized store: lengths from its offsets, no token read
            return min(store.length(int(self.ds.index[i])), self.ds.max_seq_len)
        return len(self.ds.get(i).input_ids)

    def state_dict(self) -> dict:
        pos = self.micro_index * self.micro_batch
        return {"micro_index": self.micro_index, "sample_position": pos,
                "epoch": pos // len(self.ds), "num_samples": len(self.ds),
                "micro_batch": self.micro_batch}

    def load_state_dict(self, st: dict) -> None:
        self.micro_index = int(st["micro_index"])
