"""The parallel tokenizer: records of several files -> samples, over worker processes.

The parent reads lines (bytes, unparsed) and sends them in chunks; a worker parses, masks
and answers each chunk with one ``Chunk``: the kept samples' ids and masks concatenated in
flat arrays, their lengths and lines, and what was dropped. Chunks come back in input order,
so the store is the same for any number of workers.

The chat masker is built in the caller first, so a bad template fails before any worker
starts; forked workers inherit it (``_init_worker`` keeps what the parent built), spawned
ones build their own once. A failure there (a chat template that fails on the probe
conversation) is kept and answered for every chunk, so the caller raises one ``DataError``
naming it instead of a pool that respawns dying workers forever. A worker that dies (killed,
out of memory) breaks the ``ProcessPoolExecutor``: that is one line naming it, never a hang.

Records that cannot be read (``formats.Skippable``: malformed JSON, not a conversation) and
conversations that cannot be masked (``formats.Dropped``) are skipped and counted by reason,
with the first ``file:line`` and its full message; other data errors stop the run.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass

import numpy as np

from dfo_contract.exitcodes import DataError, TrainerError

from .formats import Dropped, Skippable, iter_raw, load_line, record_arrays
from .tokenizer import load_masker

_W: dict = {}
_EMPTY_I64 = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Chunk:
    """A worker's answer for consecutive records of one input file."""

    file_index: int
    records: int                  # records read, kept or not
    lines: np.ndarray             # int64: the line of each kept sample
    lengths: np.ndarray           # int64: tokens of each kept sample
    ids: np.ndarray               # uint32: the kept samples' ids, concatenated
    mask: np.ndarray              # uint8: their 0/1 loss masks, concatenated
    drops: tuple = ()             # (line, reason, full message or None), in input order
    error: str | None = None      # a data error that stops the run (records after it unread)


def _init_worker(target: str, fmt: str, vocab_size: int, template_kwargs: dict) -> None:
    args = (target, fmt, vocab_size, template_kwargs)
    if _W.get("args") == args:  # forked from the caller, which built it already
        return
    _W.clear()
    _W.update(args=args, fmt=fmt, vocab=vocab_size)
    try:
        _W["masker"] = load_masker(target, template_kwargs)
    except DataError as e:
        _W["error"] = str(e)


def _work(task) -> Chunk:
    """(file_index, path, [(line, bytes or record)]) -> the chunk's samples."""
    fi, path, items = task
    if "error" in _W:
        return Chunk(fi, 0, _EMPTY_I64, _EMPTY_I64, _EMPTY_I64, _EMPTY_I64, error=_W["error"])
    lines, ids, masks = [], [], []
    drops: list[tuple[int, str, str | None]] = []
    error, n = None, 0
    for lineno, raw in items:
        n += 1
        where = f"data: {path}:{lineno}"
        rec = load_line(raw, where) if isinstance(raw, bytes) else raw
        try:
            i, m = record_arrays(rec, where, fmt=_W["fmt"], masker=_W["masker"], vocab_size=_W["vocab"])
        except Dropped as e:
            drops.append((lineno, str(e), None))
            continue
        except Skippable as e:
            drops.append((lineno, e.reason, str(e).removeprefix("data: ")))
            continue
        except DataError as e:
            error = str(e)
            break
        if not m.any():
            drops.append((lineno, "no loss tokens", None))
            continue
        lines.append(lineno)
        ids.append(i)
        masks.append(m)
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    return Chunk(fi, n, np.asarray(lines, dtype=np.int64), lengths,
                 np.concatenate(ids).astype(np.uint32) if ids else np.zeros(0, np.uint32),
                 np.concatenate(masks) if masks else np.zeros(0, np.uint8), tuple(drops), error)


def _tasks(paths: list[str], size: int):
    for fi, p in enumerate(paths):
        items = []
        for item in iter_raw(p):
            items.append(item)
            if len(items) >= size:
                yield fi, p, items
                items = []
        if items:
            yield fi, p, items


def _pooled(workers: int, args: tuple, tasks):
    """Results of ``_work`` over ``tasks`` in order, at most 2 chunks a worker in flight."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    ctx = mp.get_context("spawn" if sys.platform == "darwin" else "fork")
    ex = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=args)
    pending: deque = deque()
    try:
        for task in tasks:
            pending.append(ex.submit(_work, task))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool:
        raise TrainerError("tokenize: a worker process died (killed, or out of memory?); "
                           "rerun, with fewer --workers if memory is short") from None
    finally:
        for f in pending:
            f.cancel()
        ex.shutdown(wait=True, cancel_futures=True)


def tokenize_chunks(paths: list[str], *, target: str, fmt: str = "auto", vocab_size: int,
                    workers: int = 1, template_kwargs: dict | None = None, progress=None,
                    chunk_size: int = 256):
    """Yield ``Chunk``s in input order; counts and drops go to ``progress.summary``.
    Structural errors raise ``DataError`` (file:line)."""
    args = (target, fmt, vocab_size, dict(template_kwargs or {}))
    summary = progress.summary
    _W.clear()  # built afresh for each run: the target's files may have changed
    _init_worker(*args)  # here first: a template that cannot be used fails before any worker
    if "error" in _W:
        raise DataError(_W["error"])
    tasks = _tasks(paths, chunk_size)
    results = map(_work, tasks) if workers <= 1 else _pooled(workers, args, tasks)
    for c in results:
        summary.records += c.records
        for lineno, reason, message in c.drops:
            summary.drop(reason, f"{paths[c.file_index]}:{lineno}", message)
        if c.error is not None:
            raise DataError(c.error)
        summary.kept += len(c.lengths)
        summary.tokens += int(c.lengths.sum())
        summary.loss_tokens += int(c.mask.sum(dtype=np.int64))
        summary.lengths.extend(c.lengths.tolist())
        yield c
        progress.update(c.records)
