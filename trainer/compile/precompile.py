"""Dynamo's precompile cache (``compile.precompile``): entries checked before use, saved with sums.

With ``torch._dynamo.config.caching_precompile`` torch keeps, per compiled function,
``<inductor cache dir>/dynamo/<source id>/entry``: a pickle of dynamo's traced bytecode,
guards and the compiled backends. A warm start loads it instead of re-tracing. It lives in
TORCHINDUCTOR_CACHE_DIR, i.e. under ``inductor/`` of the per-run cache dir dfo snapshots,
so a snapshot carries it. torch writes the entry by rename, but it only refuses an entry
that fails to unpickle: dfo writes ``entry.sha256`` beside every entry it saved (after the
entry is complete) and, before anything compiles, removes every entry directory whose
entry is missing its checksum file or differs from it (truncated, half-copied, altered,
or written by something else), so such an entry is never loaded.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field

from dfo_contract.fsio import atomic_write_text, sha256_file

log = logging.getLogger("dfo")

PRECOMPILE_ENTRY = "entry"
PRECOMPILE_SUM = "entry.sha256"


@dataclass
class PrecompileCheck:
    """What ``verify_precompile_entries`` found: entries kept, entries removed (and why)."""
    dir: str
    kept: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)


def precompile_dir() -> str:
    """``<TORCHINDUCTOR_CACHE_DIR>/dynamo``: where torch's DynamoCache reads and writes."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.path.join(cache_dir(), "dynamo")


def verify_precompile_entries(root: str | None = None) -> PrecompileCheck:
    """Remove every precompile entry that is not complete and checksummed (before compiling)."""
    root = root or precompile_dir()
    chk = PrecompileCheck(dir=root)
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return chk
    for name in names:
        d = os.path.join(root, name)
        if not os.path.isdir(d) or os.path.islink(d):
            continue
        why = _entry_problem(d)
        if why is None:
            chk.kept.append(name)
            continue
        chk.dropped[name] = why
        shutil.rmtree(d, ignore_errors=True)
        log.warning("compile.precompile: dropped cache entry %s: %s", name, why)
    return chk


def _entry_problem(d: str) -> str | None:
    entry, sumf = os.path.join(d, PRECOMPILE_ENTRY), os.path.join(d, PRECOMPILE_SUM)
    if not os.path.isfile(entry) or os.path.islink(entry):
        return "no entry file"
    try:
        with open(sumf, encoding="ascii") as f:
            want = f.read().split()
    except (OSError, UnicodeDecodeError):
        return "no checksum file (half-written or not saved by dfo)"
    got = [sha256_file(entry), str(os.path.getsize(entry))]
    return None if want == got else "entry differs from its checksum (truncated or altered)"


def save_precompile_entries() -> dict[str, object]:
    """Write this process's precompile entries (torch's atomic write), then their checksums.

    Call after the warm-up ran every compiled function (and after
    ``torch.compiler.save_cache_artifacts``, which rewrites the same entries); only with
    ``compile.precompile`` on (``CacheSettings.configure``)."""
    from torch._dynamo.package import DynamoCache
    from torch._dynamo.precompile_context import PrecompileContext

    entries, _ = PrecompileContext.create_cache_entries()
    root = precompile_dir()
    saved, failed = [], {}
    for key, entry in entries.items():
        d = os.path.join(root, key)
        sumf = os.path.join(d, PRECOMPILE_SUM)
        try:
            if os.path.exists(sumf):
                os.unlink(sumf)  # never a checksum beside an entry being rewritten
            DynamoCache.write(entry, key)
            path = os.path.join(d, PRECOMPILE_ENTRY)
            atomic_write_text(sumf, f"{sha256_file(path)} {os.path.getsize(path)}\n")
            saved.append(key)
        except Exception as e:  # noqa: BLE001 - e.g. a guard torch cannot serialize: no entry
            failed[key] = f"{type(e).__name__}: {e}"[:300]
            log.warning("compile.precompile: could not save entry %s: %s", key, failed[key])
    return {"dir": root, "saved": saved, "failed": failed}
