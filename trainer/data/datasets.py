"""The datasets ``data.path`` names: a records file or a pre-tokenized store, validated once.

``data.path`` is one of:

- a pre-tokenized store directory (``python -m trainer.data tokenize``; trainer.data.tokenized):
  memory-mapped, nothing is parsed or tokenized at load or per step;
- a ``.jsonl`` / ``.jsonl.gz`` / ``.parquet`` file of records (trainer.data.formats): tokenized
  ``{"input_ids": [...], "loss_mask": [...]}``, OpenAI ``{"messages": [...]}`` or ShareGPT
  ``{"conversations": [{"from", "value"}]}``. Chat records are rendered with the target's
  chat template and masked by trainer.data.chat ONCE, at load; plain tokenized ``.jsonl`` lines
  are re-read by byte offset.

The data is scanned once at start: a malformed record, a missing field or a token id >= the
target's vocab gives a ``DataError`` naming ``file:line`` (the file is never modified); a
conversation that cannot be masked is dropped and counted with its reason and first
file:line; samples with fewer than ``data.min_loss_tokens`` (default ``2*B``) loss tokens
after truncation to ``data.max_seq_len`` are dropped and counted.

The order the samples are taken in is trainer.data.stream's; how a micro-batch is padded and
its anchors drawn, trainer.data.collate's.
"""

from __future__ import annotations

import logging
import os
from typing import BinaryIO

import numpy as np
from dataclasses import dataclass, field

from dfo_contract.exitcodes import DataError

from .chat import ChatMasker, Unmaskable
from .formats import (Dropped, Sample, is_gzip, is_parquet, iter_records, parse_json_line,
                      record_kind, record_sample)
from .tokenized import Summary, TokenStore, is_store, no_samples_message

log = logging.getLogger("dfo")

__all__ = ["Sample", "ScanReport", "JsonlDataset", "TokenizedDataset", "open_dataset"]


@dataclass(frozen=True)
class ScanReport:
    path: str
    lines: int
    kept: int
    dropped_short: int
    truncated: int
    mask_token_hits: int
    dropped: dict = field(default_factory=dict)        # reason -> count (cannot be masked, ...)
    first_dropped: dict = field(default_factory=dict)  # reason -> file:line

    def describe(self, min_loss_tokens: int) -> str:
        parts = [f"{self.dropped_short} dropped with < {min_loss_tokens} loss tokens",
                 f"{self.truncated} truncated"]
        for reason, n in sorted(self.dropped.items(), key=lambda kv: -kv[1]):
            parts.append(f"{n} dropped: {reason} (first at {self.first_dropped[reason]})")
        return f"data: {self.path}: {self.kept} samples ({', '.join(parts)})"


class _Dataset:
    """Shared scan bookkeeping: truncation, short drops, mask-token hits, the report."""

    def __init__(self, path, *, vocab_size, block_size, max_seq_len, min_loss_tokens, mask_token_id):
        self.path = path
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.min_loss_tokens = 2 * block_size if min_loss_tokens is None else min_loss_tokens
        self.mask_token_id = mask_token_id
        self.summary = Summary()
        self.short = self.truncated = self.hits = 0

    def _truncate(self, s: Sample) -> Sample:
        if len(s.input_ids) <= self.max_seq_len:
            return s
        return Sample(s.input_ids[: self.max_seq_len], s.loss_mask[: self.max_seq_len])

    def _report(self, kept: int) -> ScanReport:
        if not kept:
            raise DataError(no_samples_message(self.path, self.summary, self.min_loss_tokens, self.short))
        return ScanReport(self.path, self.summary.records, kept, self.short, self.truncated, self.hits,
                          dict(self.summary.dropped), dict(self.summary.first_dropped))

    def close(self) -> None:
        pass


class JsonlDataset(_Dataset):
    """Records from a .jsonl/.jsonl.gz/.parquet file, validated once.

    Tokenized lines of a plain .jsonl are re-read lazily by byte offset; everything else
    (chat records, compressed or parquet files) is tokenized once here and kept in memory.
    """

    def __init__(self, path: str, *, vocab_size: int, block_size: int, max_seq_len: int,
                 min_loss_tokens: int | None = None, fmt: str = "auto", tokenizer=None,
                 mask_token_id: int | None = None, masker: ChatMasker | None = None):
        super().__init__(path, vocab_size=vocab_size, block_size=block_size, max_seq_len=max_seq_len,
                         min_loss_tokens=min_loss_tokens, mask_token_id=mask_token_id)
        self.fmt = fmt
        self.tokenizer = tokenizer
        self._masker = masker
        self._masker_error: str | None = None
        self.offsets: list[int | None] = []
        self.linenos: list[int] = []
        self.lengths: list[int] = []
        self._mem: dict[int, tuple] = {}  # compact: (uint32 ids, uint8 mask), 5 bytes a token
        self._fh: BinaryIO | None = None
        self.report = self._scan()

    def masker(self, where: str) -> ChatMasker | None:
        if self._masker is None and self.tokenizer is not None and self._masker_error is None:
            try:
                self._masker = ChatMasker(self.tokenizer)
            except Unmaskable as e:
                self._masker_error = str(e)
        if self._masker_error:
            raise DataError(f"{where}: chat data cannot be masked: {self._masker_error}")
        return self._masker

    def _records(self):
        """(lineno, byte offset or None, record)."""
        if not os.path.isfile(self.path):
            raise DataError(f"data: {self.path}: no such file (set --data.path; "
                            "python -m trainer.data synth --out FILE writes a synthetic one)")
        if is_parquet(self.path) or is_gzip(self.path):
            for lineno, rec in iter_records(self.path):
                yield lineno, None, rec
            return
        with open(self.path, "rb") as f:
            offset = 0
            for lineno, raw in enumerate(f, start=1):
                start, offset = offset, offset + len(raw)
                if raw.strip():
                    yield lineno, start, parse_json_line(raw, f"data: {self.path}:{lineno}")

    def _scan(self) -> ScanReport:
        for lineno, start, rec in self._records():
            self.summary.records += 1
            where = f"data: {self.path}:{lineno}"
            is_chat = isinstance(rec, dict) and record_kind(rec, self.fmt) == "chat"
            try:
                s = record_sample(rec, where, fmt=self.fmt, vocab_size=self.vocab_size,
                                  masker=self.masker(where) if is_chat else None)
            except Dropped as e:
                self.summary.drop(str(e), f"{self.path}:{lineno}")
                continue
            if len(s.input_ids) > self.max_seq_len:
                self.truncated += 1
                s = self._truncate(s)
            if self.mask_token_id is not None and self.mask_token_id in s.input_ids:
                self.hits += 1
            if sum(s.loss_mask) < self.min_loss_tokens:
                self.short += 1
                continue
            k = len(self.linenos)
            self.linenos.append(lineno)
            self.lengths.append(len(s.input_ids))  # after truncation: BatchStream.skip counts it
            lazy = start is not None and not is_chat
            self.offsets.append(start if lazy else None)
            if not lazy:
                self._mem[k] = (np.asarray(s.input_ids, dtype=np.uint32),
                                np.asarray(s.loss_mask, dtype=np.uint8))
        if len(self._mem) > 100_000:
            log.warning("data: %s: %d samples were tokenized at load and are held in memory; "
                        "python -m trainer.data tokenize makes a store that loads instantly",
                        self.path, len(self._mem))
        return self._report(len(self.linenos))

    def __len__(self) -> int:
        return len(self.linenos)

    def get(self, i: int) -> Sample:
        s = self._mem.get(i)
        if s is not None:
            return Sample(s[0].astype(np.int64).tolist(), s[1].tolist())
        at = self.offsets[i]
        if at is None:               # held in memory: _mem answered above
            raise KeyError(f"{self.path}: sample {i} is neither in memory nor at an offset")
        fh = self._fh
        if fh is None:
            fh = self._fh = open(self.path, "rb")
        fh.seek(at)
        where = f"data: {self.path}:{self.linenos[i]}"
        rec = parse_json_line(fh.readline(), where)
        return self._truncate(record_sample(rec, where, fmt=self.fmt, masker=None,
                                            vocab_size=self.vocab_size))

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class TokenizedDataset(_Dataset):
    """A pre-tokenized store (trainer.data.tokenized), memory-mapped; filters are vectorised."""

    def __init__(self, path: str, *, vocab_size: int, block_size: int, max_seq_len: int,
                 min_loss_tokens: int | None = None, mask_token_id: int | None = None, **_ignored):
        super().__init__(path, vocab_size=vocab_size, block_size=block_size, max_seq_len=max_seq_len,
                         min_loss_tokens=min_loss_tokens, mask_token_id=mask_token_id)
        self.store = st = TokenStore(path)
        m = st.manifest
        self.summary.records = int(m.get("records", st.n))
        for reason, n in (m.get("dropped") or {}).items():
            self.summary.dropped[reason] = n
            self.summary.first_dropped[reason] = (m.get("first_dropped") or {}).get(reason, "?")
        lengths = np.diff(np.asarray(st.offsets))
        self.truncated = int((lengths > max_seq_len).sum())
        counts = st.loss_counts(max_seq_len)
        keep = counts >= self.min_loss_tokens
        self.short = int((~keep).sum())
        self.index = np.nonzero(keep)[0]
        top, hit_at = -1, []
        step = 1 << 26  # 64M tokens at a time: bounded memory on any store size
        for a in range(0, int(st.offsets[-1]) if st.n else 0, step):
            chunk = np.asarray(st.tokens[a:a + step])
            top = max(top, int(chunk.max()))
            if mask_token_id is not None:
                hit_at.append(np.nonzero(chunk == mask_token_id)[0] + a)
        if top >= vocab_size:
            raise DataError(f"data: {path}: token id {top} >= the target's vocab size {vocab_size}; "
                            f"the store was tokenized for another target ({m.get('target')})")
        if hit_at:
            at = np.concatenate(hit_at)
            self.hits = len(np.unique(np.searchsorted(np.asarray(st.offsets), at, side="right")))
        self.linenos = self.index  # for messages only
        self.report = self._report(len(self.index))

    def __len__(self) -> int:
        return len(self.index)

    def get(self, i: int) -> Sample:
        return self.store.sample(int(self.index[i]), self.max_seq_len)


def open_dataset(path: str, **kw):
    """The dataset for ``data.path``: a store directory or a records file."""
    if is_store(path):
        kw.pop("fmt", None), kw.pop("tokenizer", None), kw.pop("masker", None)
        return TokenizedDataset(path, **kw)
    if os.path.isdir(path):
        raise DataError(f"data: {path}: a directory without manifest.json (give a .jsonl, "
                        ".jsonl.gz or .parquet file, or a store written by python -m trainer.data tokenize)")
    return JsonlDataset(path, **kw)
