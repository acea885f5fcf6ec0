"""The pre-tokenized store (what ``data.path`` reads fastest) and the parallel tokenizer.

A store is a directory:

- ``tokens.u32``   every sample's token ids, concatenated (little-endian uint32);
- ``offsets.i64``  n+1 offsets into ``tokens.u32`` (sample i is ``[off[i], off[i+1])``);
- ``loss.bits``    the loss mask, one bit per token (``numpy.packbits``, little bit order);
- ``origin.i64``   ``file_index << 40 | line`` of each sample, for file:line messages;
- ``manifest.json`` counts, the inputs (with sha256), the tokenizer's sha256, the sha256 of
  every file above, what was dropped and why, and a length histogram.

The directory is built under a temporary name and renamed into place, so a store is either
complete or absent. Reading memory-maps the arrays: opening a store of a million samples
reads only the manifest and the offsets.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from dfo_contract.exitcodes import DataError
from dfo_contract.fsio import atomic_write_text, fsync_dir, replace_dir, sha256_file, tmp_name

from .formats import Sample
from .pool import tokenize_chunks

FORMAT = "dfo-tokenized"
VERSION = 1
FILES = ("tokens.u32", "offsets.i64", "loss.bits", "origin.i64")
LINE_BITS = 40
HIST_EDGES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def is_store(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "manifest.json"))


def histogram(lengths) -> dict[str, int]:
    out: dict[str, int] = {}
    lo = 0
    arr = np.asarray(lengths, dtype=np.int64)
    for hi in HIST_EDGES:
        out[f"{lo + 1}-{hi}"] = int(((arr > lo) & (arr <= hi)).sum())
        lo = hi
    out[f">{lo}"] = int((arr > lo).sum())
    return {k: v for k, v in out.items() if v}


@dataclass
class Summary:
    records: int = 0
    kept: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    dropped: Counter = field(default_factory=Counter)
    first_dropped: dict = field(default_factory=dict)   # reason -> "file:line"
    lengths: list = field(default_factory=list)

    def drop(self, reason: str, where: str, message: str | None = None) -> None:
        """Count a skipped record; the first of each reason is kept as ``file:line`` (or the
        record's full message, which names file:line)."""
        self.dropped[reason] += 1
        self.first_dropped.setdefault(reason, message or where)

    def lines(self) -> list[str]:
        out = [f"samples: {self.kept} kept of {self.records} records; {self.tokens} tokens, "
               f"{self.loss_tokens} under loss"]
        for reason, n in self.dropped.most_common():
            out.append(f"dropped {n}: {reason} (first: {self.first_dropped[reason]})")
        hist = histogram(self.lengths)
        if hist:
            out.append("lengths: " + ", ".join(f"{k}: {v}" for k, v in hist.items()))
        return out


def write_store(out: str, paths: list[str], *, target: str, vocab_size: int, fmt: str = "auto",
                workers: int = 1, template_kwargs: dict | None = None, progress) -> Summary:
    """Tokenize ``paths`` into the store ``out`` (built aside, renamed into place)."""
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tmp_name(out)
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    summary = progress.summary
    offsets, origin, total = [np.zeros(1, dtype=np.int64)], [], 0
    bit_tail = np.zeros(0, dtype=np.uint8)
    try:
        with open(os.path.join(tmp, "tokens.u32"), "wb") as ft, \
                open(os.path.join(tmp, "loss.bits"), "wb") as fb:
            for c in tokenize_chunks(paths, target=target, fmt=fmt, vocab_size=vocab_size,
                                     workers=workers, template_kwargs=template_kwargs,
                                     progress=progress):
                ft.write(c.ids.astype("<u4", copy=False).tobytes())
                offsets.append(total + np.cumsum(c.lengths))
                total += int(c.lengths.sum())
                origin.append((c.file_index << LINE_BITS) | c.lines)
                bits = np.concatenate([bit_tail, c.mask])
                whole = len(bits) - len(bits) % 8
                fb.write(np.packbits(bits[:whole], bitorder="little").tobytes())
                bit_tail = bits[whole:]
            if len(bit_tail):
                fb.write(np.packbits(bit_tail, bitorder="little").tobytes())
            for f in (ft, fb):
                f.flush()
                os.fsync(f.fileno())
        if summary.kept == 0:
            raise DataError(no_samples_message(", ".join(paths), summary))
        np.concatenate(offsets).astype("<i8").tofile(os.path.join(tmp, "offsets.i64"))
        np.concatenate(origin).astype("<i8").tofile(os.path.join(tmp, "origin.i64"))
        manifest = {
            "format": FORMAT, "version": VERSION, "num_samples": summary.kept,
            "num_tokens": summary.tokens, "loss_tokens": summary.loss_tokens,
            "vocab_size": vocab_size, "target": os.path.abspath(target),
            "tokenizer_sha256": tokenizer_sha256(target),
            "inputs": [{"path": os.path.abspath(p), "sha256": sha256_file(p)} for p in paths],
            "files": {f: sha256_file(os.path.join(tmp, f)) for f in FILES},
            "records": summary.records, "dropped": dict(summary.dropped),
            "first_dropped": summary.first_dropped, "length_histogram": histogram(summary.lengths),
        }
        atomic_write_text(os.path.join(tmp, "manifest.json"), json.dumps(manifest, indent=1) + "\n")
        fsync_dir(tmp)
        replace_dir(tmp, out)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return summary


def tokenizer_sha256(target: str) -> str | None:
    p = os.path.join(target, "tokenizer.json")
    return sha256_file(p) if os.path.isfile(p) else None


def no_samples_message(path: str, summary: Summary, min_loss_tokens: int | None = None,
                       short: int = 0) -> str:
    """One line: why a data file gave no usable sample (advice only where it can help)."""
    parts = []
    for reason, n in summary.dropped.most_common(3):
        parts.append(f"{n} dropped: {reason} (first at {summary.first_dropped[reason]})")
    if short:
        parts.append(f"{short} with fewer than {min_loss_tokens} loss tokens (lower "
                     "--data.min_loss_tokens or use longer samples)")
    why = "; ".join(parts) or "the file has no records"
    return f"data: {path}: no usable samples of {summary.records} records: {why}"


# --------------------------------------------------------------------------- reading

class TokenStore:
    """A store opened read-only (memory-mapped)."""

    def __init__(self, path: str):
        self.path = path
        mpath = os.path.join(path, "manifest.json")
        try:
            with open(mpath) as f:
                self.manifest = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise DataError(f"data: {mpath}: unreadable manifest ({e}); re-run "
                            "python -m trainer.data tokenize") from None
        m = self.manifest
        if m.get("format") != FORMAT or m.get("version") != VERSION:
            raise DataError(f"data: {mpath}: not a {FORMAT} v{VERSION} store; re-run "
                            "python -m trainer.data tokenize")
        self.n = int(m["num_samples"])
        self.offsets = self._map("offsets.i64", "<i8", self.n + 1)
        total = int(self.offsets[-1]) if self.n else 0
        if total != int(m["num_tokens"]):
            raise DataError(f"data: {path}: offsets.i64 does not match the manifest (torn store); "
                            "re-run python -m trainer.data tokenize")
        self.tokens = self._map("tokens.u32", "<u4", total)
        self.bits = self._map("loss.bits", "u1", (total + 7) // 8)
        self.origin = self._map("origin.i64", "<i8", self.n)
        self.inputs = [i["path"] for i in m.get("inputs", [])]

    def _map(self, name: str, dtype: str, count: int):
        p = os.path.join(self.path, name)
        want = count * np.dtype(dtype).itemsize
        size = os.path.getsize(p) if os.path.isfile(p) else -1
        if size != want:
            raise DataError(f"data: {p}: {size} bytes, the manifest says {want} (torn or edited "
                            "store); re-run python -m trainer.data tokenize")
        if want == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(p, dtype=dtype, mode="r", shape=(count,))

    def where(self, i: int) -> str:
        o = int(self.origin[i])
        fi, line = o >> LINE_BITS, o & ((1 << LINE_BITS) - 1)
        name = self.inputs[fi] if fi < len(self.inputs) else "?"
        return f"{name}:{line}"

    def length(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    def mask(self, i: int, limit: int | None = None) -> np.ndarray:
        a = int(self.offsets[i])
        n = self.length(i) if limit is None else min(limit, self.length(i))
        lo, hi = a // 8, (a + n + 7) // 8
        bits = np.unpackbits(np.asarray(self.bits[lo:hi]), bitorder="little")
        return bits[a % 8: a % 8 + n]

    def ids(self, i: int, limit: int | None = None) -> np.ndarray:
        a = int(self.offsets[i])
        n = self.length(i) if limit is None else min(limit, self.length(i))
        return np.asarray(self.tokens[a:a + n])

    def sample(self, i: int, limit: int | None = None) -> Sample:
        return Sample(self.ids(i, limit).astype(np.int64).tolist(), self.mask(i, limit).tolist())

    def loss_counts(self, limit: int) -> np.ndarray:
        """Loss tokens of every sample within its first ``limit`` tokens (chunked, vectorised)."""
        out = np.zeros(self.n, dtype=np.int64)
        step = 4096
        for s in range(0, self.n, step):
            e = min(self.n, s + step)
            a, b = int(self.offsets[s]), int(self.offsets[e])
            lo = a // 8
            bits = np.unpackbits(np.asarray(self.bits[lo:(b + 7) // 8]), bitorder="little")
            cum = np.concatenate([[0], np.cumsum(bits, dtype=np.int64)])
            starts = self.offsets[s:e].astype(np.int64) - lo * 8
            ends = np.minimum(self.offsets[s + 1:e + 1].astype(np.int64), self.offsets[s:e] + limit) - lo * 8
            out[s:e] = cum[ends] - cum[starts]
        return out
