"""Reading training records: ``.jsonl``, ``.jsonl.gz`` and ``.parquet``, and turning one
record into a sample (pre-tokenized, OpenAI ``messages`` or ShareGPT ``conversations``).

``iter_records(path)`` yields ``(lineno, record)``: the 1-based line of a JSON-lines file or
the 1-based row of a parquet file, so every message names ``file:line``. Parquet needs
pyarrow (not in the trainer's locked environment): without it, a ``DataError`` says to
install pyarrow or convert to JSONL.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from dfo_contract.exitcodes import DataError

from .chat import ChatMasker, Unmaskable, template_error
from .records import BadRecord, conversation_from_record

SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz", ".parquet", ".json")


@dataclass
class Sample:
    input_ids: list[int]
    loss_mask: list[int]


class Dropped(Exception):
    """A well-formed record that yields no trainable sample (the message is the reason)."""


class Skippable(DataError):
    """A record that cannot be read (malformed JSON, not an object, not a conversation): the
    training loader stops on it like on any data error; ``tokenize`` and ``regenerate`` skip
    it and count it under ``reason`` (the message names file:line and the full cause)."""

    def __init__(self, message: str, reason: str = "bad record"):
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):
        return (type(self), (self.message, self.reason))


@dataclass(frozen=True)
class BadLine:
    """A line that is not JSON, read with ``skip_bad``: where, and the parser's full message."""

    where: str
    error: str

    def exception(self) -> Skippable:
        return Skippable(f"{self.where}: malformed JSON ({self.error}); fix or remove the line",
                         "malformed JSON")


def is_parquet(path: str) -> bool:
    return path.endswith(".parquet")


def is_gzip(path: str) -> bool:
    return path.endswith(".gz")


def iter_records(path: str, skip_bad: bool = False) -> Iterator[tuple[int, object]]:
    """(line, record) pairs; a line that is not JSON raises a ``Skippable`` naming file:line,
    or with ``skip_bad`` is yielded as a ``BadLine``."""
    for lineno, raw in iter_raw(path):
        if isinstance(raw, bytes):
            rec = load_line(raw, f"data: {path}:{lineno}")
            if isinstance(rec, BadLine) and not skip_bad:
                raise rec.exception()
            yield lineno, rec
        else:
            yield lineno, raw


def iter_raw(path: str) -> Iterator[tuple[int, object]]:
    """(line, the line's bytes) of a JSON-lines file, blank lines skipped; (row, record) of a
    parquet file. ``load_line`` parses a line (``tokenize`` parses in its workers)."""
    if not os.path.exists(path):
        raise DataError(f"data: {path}: no such file")
    if is_parquet(path):
        yield from _iter_parquet(path)
        return
    opener = gzip.open if is_gzip(path) else open
    with opener(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if raw.strip():
                yield lineno, raw


def load_line(raw: bytes, where: str):
    """A JSON line's record, or a ``BadLine`` when it is not JSON."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return BadLine(where, str(e))


def parse_json_line(raw: bytes, where: str):
    rec = load_line(raw, where)
    if isinstance(rec, BadLine):
        raise rec.exception()
    return rec


def _iter_parquet(path: str):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"data: {path}: reading parquet needs pyarrow, which this environment "
                        "lacks (pip install pyarrow, or convert the file to .jsonl)") from None
    pf = pq.ParquetFile(path)
    row = 0
    for batch in pf.iter_batches(batch_size=1024):
        for rec in batch.to_pylist():
            row += 1
            yield row, _plain(rec)


def _plain(v):
    """Parquet rows: drop null struct fields (a union schema fills absent keys with None)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def count_records(path: str) -> int | None:
    """Records in a file (for progress), or None when cheap counting is impossible."""
    if not os.path.isfile(path):
        return None
    if is_parquet(path):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            return None
        return int(pq.ParquetFile(path).metadata.num_rows)
    opener = gzip.open if is_gzip(path) else open
    n = 0
    with opener(path, "rb") as f:
        for raw in f:
            n += bool(raw.strip())
    return n


def record_kind(obj: dict, fmt: str = "auto") -> str:
    if fmt != "auto":
        return fmt
    chat = ("messages" in obj or "conversations" in obj) and "input_ids" not in obj
    return "chat" if chat else "tokens"


def tokens_sample(obj: dict, where: str, vocab_size: int) -> Sample:
    for key in ("input_ids", "loss_mask"):
        if key not in obj:
            raise DataError(f"{where}: missing field {key!r} (tokenized lines need "
                            "input_ids and loss_mask; chat lines need messages)")
    ids, mask = obj["input_ids"], obj["loss_mask"]
    if not isinstance(ids, list) or not ids:
        raise DataError(f"{where}: input_ids must be a non-empty list of token ids")
    if not isinstance(mask, list) or len(mask) != len(ids):
        raise DataError(f"{where}: loss_mask must be a list as long as input_ids "
                        f"({len(ids)}), got {len(mask) if isinstance(mask, list) else type(mask).__name__}")
    for j, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise DataError(f"{where}: input_ids[{j}] = {t!r} is not a token id (integer >= 0)")
        if t >= vocab_size:
            raise DataError(f"{where}: input_ids[{j}] = {t} >= the target's vocab size "
                            f"{vocab_size}; tokenize with the target's tokenizer")
    out_mask = []
    for j, m in enumerate(mask):
        if isinstance(m, str | list | dict) or m not in (0, 1):
            raise DataError(f"{where}: loss_mask[{j}] = {m!r}; expected 0 or 1")
        out_mask.append(int(m))
    return Sample(list(ids), out_mask)


def chat_sample(obj: dict, where: str, masker: ChatMasker | None, vocab_size: int) -> Sample:
    """A chat record -> Sample. Structural errors raise DataError; a conversation that
    cannot be masked raises ``Dropped`` (the caller counts it and names file:line)."""
    ids, mask = chat_arrays(obj, where, masker, vocab_size)
    return Sample(ids.tolist(), mask.tolist())


def chat_arrays(obj: dict, where: str, masker: ChatMasker | None,
                vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``chat_sample`` as arrays: ids (int64) and the loss mask (uint8)."""
    try:
        conv = conversation_from_record(obj)
    except BadRecord as e:
        raise Skippable(f"{where}: {e}", f"bad record: {e.reason}") from None
    if masker is None:
        raise DataError(f"{where}: chat data needs the target's tokenizer, and "
                        "--model.target_path has none; pre-tokenize the data")
    try:
        ids, mask = masker.mask_arrays(conv)
    except Unmaskable as e:
        raise Dropped(f"cannot mask: {e}") from None
    except Exception as e:  # noqa: BLE001 - a template error on this sample only
        raise Dropped(f"the chat template failed on it: {template_error(e)}") from None
    bad = ids[ids >= vocab_size]
    if len(bad):
        raise DataError(f"{where}: the tokenizer produced id {bad[0]} >= the target's vocab "
                        f"size {vocab_size}; the tokenizer does not match the target")
    return ids, mask


def _checked(obj, where: str, fmt: str) -> str:
    """The record's kind (chat or tokens); a line that is not a JSON object raises Skippable."""
    if isinstance(obj, BadLine):
        raise obj.exception()
    if not isinstance(obj, dict):
        raise Skippable(f"{where}: expected a JSON object, got {type(obj).__name__}", "not a JSON object")
    return record_kind(obj, fmt)


def record_sample(obj, where: str, *, fmt: str, masker: ChatMasker | None, vocab_size: int) -> Sample:
    if _checked(obj, where, fmt) == "tokens":
        return tokens_sample(obj, where, vocab_size)
    return chat_sample(obj, where, masker, vocab_size)


def record_arrays(obj, where: str, *, fmt: str, masker: ChatMasker | None,
                  vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``record_sample`` as arrays: ids (int64) and the loss mask (uint8)."""
    if _checked(obj, where, fmt) == "tokens":
        s = tokens_sample(obj, where, vocab_size)
        return np.asarray(s.input_ids, dtype=np.int64), np.asarray(s.loss_mask, dtype=np.uint8)
    return chat_arrays(obj, where, masker, vocab_size)
