"""The micro-batch stream of training: ``Order`` (sample position -> dataset index),
``BatchStream`` (bucketed: ``micro_batch`` samples a micro-batch, one-integer state),
``PackedStream`` (packed rows, trainer.data.pack: state (micro-batch index, sample position))
and ``SkippedBatch`` (a micro-batch another ddp rank builds; only its counts).
``stream_for`` picks one for a config.

Order: sample position p (a global counter) maps to epoch ``p // n`` and to index
``perm(seed, epoch)[p % n]``; ``perm`` is a seeded shuffle, so the order is a pure function
of (seed, epoch) and resuming needs only p. The datasets are trainer.data.datasets'.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from dfo_contract.exitcodes import TrainerConfigError

from .collate import collate
from .pack import RowShape, anchor_need, pack_rows, plan_rows


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
        self.kw: dict[str, Any] = dict(
            block_size=block_size, num_anchors=num_anchors, seq_buckets=seq_buckets,
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
        return sample_length(self.ds, i)

    def state_dict(self) -> dict:
        pos = self.micro_index * self.micro_batch
        return {"micro_index": self.micro_index, "sample_position": pos,
                "epoch": pos // len(self.ds), "num_samples": len(self.ds),
                "micro_batch": self.micro_batch}

    def load_state_dict(self, st: dict) -> None:
        if st.get("packed"):
            raise TrainerConfigError("resume: the checkpoint was trained on packed rows; resume "
                                     "it with --data.pack true (or start anew)")
        self.micro_index = int(st["micro_index"])


def sample_length(ds, i: int) -> int:
    """Tokens of dataset sample ``i`` after truncation, without reading its tokens where the
    dataset knows them."""
    lengths = getattr(ds, "lengths", None)
    if lengths is not None:  # a records file: lengths noted at the scan, nothing re-read
        return lengths[i]
    store = getattr(ds, "store", None)
    if store is not None:  # a tokenized store: lengths from its offsets, no token read
        return min(store.length(int(ds.index[i])), ds.max_seq_len)
    return len(ds.get(i).input_ids)


class PackedStream:
    """Micro-batches of packed rows (trainer.data.pack) in the deterministic order of
    ``Order``; its state is the micro-batch index and the next sample position.

    The same interface as ``BatchStream``: ``take(n, keep)`` plans every micro-batch (each
    starts where the one before ended) but builds only those at ``keep``."""

    def __init__(self, ds, *, micro_batch: int, block_size: int, num_anchors: int,
                 row: RowShape, seed: int, shuffle: bool = True, pad_id: int = 0):
        self.ds = ds
        self.micro_batch = micro_batch
        self.row = row
        self.num_anchors = num_anchors
        self.kw: dict[str, Any] = dict(
            shape=row, block_size=block_size, num_anchors=num_anchors, seed=seed,
            pad_id=pad_id)
        self.order = Order(len(ds), seed, shuffle)
        self.micro_index = 0
        self.position = 0
        self._need: dict[int, int] = {}

    def _cost(self, i: int) -> tuple[int, int]:
        need = self._need.get(i)
        if need is None:
            need = self._need[i] = anchor_need(self.ds.get(i).loss_mask, self.num_anchors)
            if len(self._need) > 1 << 16:
                self._need.clear()
        return sample_length(self.ds, i), need

    def _plan(self) -> list[list[int]]:
        """The next micro-batch's rows (dataset indices); advances the state."""
        start = self.position
        idx: list[int] = []

        def costs():
            p = start
            while True:
                _, i = self.order.index(p)
                idx.append(i)
                yield self._cost(i)
                p += 1
        rows, taken = plan_rows(costs(), self.micro_batch, self.row)
        self.position = start + taken
        self.micro_index += 1
        return [[idx[k] for k in r] for r in rows]

    def next(self):
        m = self.micro_index
        rows = self._plan()
        return pack_rows([[self.ds.get(i) for i in r] for r in rows], micro_index=m, **self.kw)

    def skip(self) -> SkippedBatch:
        rows = self._plan()
        return SkippedBatch(num_tokens=sum(sample_length(self.ds, i) for r in rows for i in r),
                            num_samples=sum(len(r) for r in rows))

    def take(self, n: int, keep=None) -> list:
        keep = range(n) if keep is None else set(keep)
        return [self.next() if k in keep else self.skip() for k in range(n)]

    def state_dict(self) -> dict:
        return {"micro_index": self.micro_index, "sample_position": self.position,
                "epoch": self.position // len(self.ds), "num_samples": len(self.ds),
                "micro_batch": self.micro_batch, "packed": True}

    def load_state_dict(self, st: dict) -> None:
        self.micro_index = int(st["micro_index"])
        self.position = int(st.get("sample_position", self.micro_index * self.micro_batch))


def stream_for(ds, cfg):
    """The training stream of ``ds`` for a ``TrainerConfig``: packed rows with ``data.pack``,
    else bucketed batches."""
    common = dict(micro_batch=cfg.train.micro_batch, block_size=cfg.model.block_size,
                  num_anchors=cfg.data.num_anchors, seed=cfg.train.seed,
                  shuffle=cfg.data.shuffle)
    if cfg.data.pack:
        return PackedStream(ds, row=RowShape(*cfg.pack_row()), **common)
    return BatchStream(ds, seq_buckets=cfg.seq_buckets(), anchor_buckets=cfg.anchor_buckets(),
                       **common)
