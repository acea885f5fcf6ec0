"""The parallel tokenizer: records of several files -> samples, over worker processes.

Each worker builds the target's chat masker once (``_init_worker``); a failure there (a chat
template that fails on the probe conversation) is kept and answered for every chunk, so the
caller raises one ``DataError`` naming it instead of a pool that respawns dying workers
forever. The masker is built in the caller first, so a bad template fails before any worker
starts. A worker that dies (killed, out of memory) breaks the ``ProcessPoolExecutor``: that is
one line naming it, never a hang.

Records that cannot be read (``formats.Skippable``: malformed JSON, not a conversation) and
conversations that cannot be masked (``formats.Dropped``) are skipped and counted by reason,
with the first ``file:line`` and its full message; other data errors stop the run.
"""

from __future__ import annotations

import sys
from collections import deque

import numpy as np

from dfo_contract.exitcodes import DataError, TrainerError

from .formats import Dropped, Skippable, iter_records, record_sample
from .tokenizer import load_masker

_W: dict = {}


def _init_worker(target: str, fmt: str, vocab_size: int, template_kwargs: dict) -> None:
    _W.clear()
    _W.update(fmt=fmt, vocab=vocab_size)
    try:
        _W["masker"] = load_masker(target, template_kwargs)
    except DataError as e:
        _W["error"] = str(e)


def _work(chunk):
    """[(file_index, where, lineno, record)] -> [(fi, lineno, ids|None|False, payload)]:
    ids and mask, None and (reason, first message) for a skipped record, False and an error."""
    if "error" in _W:
        return [(chunk[0][0], chunk[0][2], False, _W["error"])]
    out = []
    for fi, where, lineno, rec in chunk:
        try:
            s = record_sample(rec, where, fmt=_W["fmt"], masker=_W["masker"], vocab_size=_W["vocab"])
        except Dropped as e:
            out.append((fi, lineno, None, (str(e), None)))
            continue
        except Skippable as e:
            out.append((fi, lineno, None, (e.reason, str(e).removeprefix("data: "))))
            continue
        except DataError as e:
            out.append((fi, lineno, False, str(e)))
            continue
        if not any(s.loss_mask):
            out.append((fi, lineno, None, ("no loss tokens", None)))
            continue
        out.append((fi, lineno, np.asarray(s.input_ids, dtype=np.uint32),
                    np.asarray(s.loss_mask, dtype=np.uint8)))
    return out


def _chunks(paths: list[str], size: int):
    chunk = []
    for fi, p in enumerate(paths):
        for lineno, rec in iter_records(p, skip_bad=True):
            chunk.append((fi, f"data: {p}:{lineno}", lineno, rec))
            if len(chunk) >= size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _pooled(workers: int, args: tuple, chunks):
    """Results of ``_work`` over ``chunks`` in order, at most 2 chunks a worker in flight."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    ctx = mp.get_context("spawn" if sys.platform == "darwin" else "fork")
    ex = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=args)
    pending: deque = deque()
    try:
        for chunk in chunks:
            pending.append(ex.submit(_work, chunk))
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


def tokenize_records(paths: list[str], *, target: str, fmt: str = "auto", vocab_size: int,
                     workers: int = 1, template_kwargs: dict | None = None, progress=None,
                     chunk_size: int = 256):
    """Yield (file_index, lineno, ids, mask) for kept samples, in input order; counts and
    drops go to ``progress.summary``. Structural errors raise ``DataError`` (file:line)."""
    args = (target, fmt, vocab_size, dict(template_kwargs or {}))
    summary = progress.summary
    _init_worker(*args)  # here first: a template that cannot be used fails before any worker
    if "error" in _W:
        raise DataError(_W["error"])
    chunks = _chunks(paths, chunk_size)
    results = map(_work, chunks) if workers <= 1 else _pooled(workers, args, chunks)
    for res in results:
        for fi, lineno, ids, extra in res:
            if ids is False:
                raise DataError(extra)
            summary.records += 1
            if ids is None:
                summary.drop(extra[0], f"{paths[fi]}:{lineno}", extra[1])
                continue
            summary.kept += 1
            summary.tokens += len(ids)
            summary.loss_tokens += int(extra.sum())
            summary.lengths.append(len(ids))
            yield fi, lineno, ids, extra
        progress.update(len(res))
