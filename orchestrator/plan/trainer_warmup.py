"""The trainer's warm-up as dfo runs it (pure): its argv and environment, and the parsing
of its report and its error output. ``orchestrator.engine.cache_warmup`` runs it."""

from __future__ import annotations

import json
import posixpath
from typing import Sequence

from dfo_contract.replies import WarmupShape

from ..common.errors import CacheError

#: how the env's python runs the trainer's warm-up (docs/contracts.md)
WARMUP_ARGS: tuple[str, ...] = ("-m", "trainer", "warmup")
#: flock's exit status when the host's cache lock is held (not one the trainer uses)
LOCK_CONFLICT = 75


def parse_report(data: bytes | str) -> tuple[list[WarmupShape], dict[str, int], float]:
    """The trainer's warm-up report -> (records, counter totals, total seconds).
    Records are ``WarmupShape`` (the trainer's trainer.compile.gate.WarmupRecord)."""
    try:
        rep = json.loads(data)
    except ValueError:
        raise CacheError("the trainer's warm-up report is not JSON",
                         hint="check the trainer version in the env (`dfo deploy --check`)") from None
    recs = None
    if isinstance(rep, list):
        recs = rep
    elif isinstance(rep, dict):
        for k in ("records", "shapes", "warmup"):
            if isinstance(rep.get(k), list):
                recs = rep[k]
                break
    if recs is None:
        raise CacheError("the trainer's warm-up report has no records")
    records: list[WarmupShape] = []
    totals: dict[str, int] = {}
    for r in recs:
        if not isinstance(r, dict):
            continue
        rec = WarmupShape.from_json(r)
        for k, v in rec.counters.items():
            totals[k] = totals.get(k, 0) + v
        records.append(rec)
    if isinstance(rep, dict) and isinstance(rep.get("totals"), dict):  # process totals
        totals = {k: int(v) for k, v in rep["totals"].items() if isinstance(v, (int, float))}
    total_s = sum(r.seconds for r in records)
    if isinstance(rep, dict) and isinstance(rep.get("seconds"), (int, float)):
        total_s = float(rep["seconds"])  # the whole warm-up, model building included
    return records, totals, round(total_s, 3)


def warmup_env(cache_dir: str) -> dict[str, str]:
    return {"TORCHINDUCTOR_CACHE_DIR": posixpath.join(cache_dir, "inductor"),
            "TRITON_CACHE_DIR": posixpath.join(cache_dir, "triton"),
            "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0"}


def warmup_argv(python: str, cfg_path: str, overrides: Sequence[tuple[str, str]], report: str,
                *, save_mega: str | None = None, load_mega: str | None = None) -> list[str]:
    argv = [python, *WARMUP_ARGS]
    if cfg_path:
        argv += ["--config", cfg_path]
    argv += [f"--{k}={v}" for k, v in overrides]  # one token each: a value is never a flag
    argv += ["--report", report]
    if save_mega:
        argv += ["--save-mega-cache", save_mega]
    if load_mega:
        argv += ["--load-mega-cache", load_mega]
    return argv


def warmup_error_line(lines: Sequence[str]) -> str:
    """The line that says what went wrong: the trainer's ``trainer: error: ...`` line,
    else the last exception line, else the last non-empty line."""
    for ln in reversed(lines):
        if ln.startswith("trainer: error:"):
            return ln[len("trainer: error:"):].strip()
    for ln in reversed(lines):
        s = ln.strip()
        if s and ("Error:" in s.split(" ", 1)[0] or s.split(":", 1)[0].endswith(("Error", "Exception"))):
            return s
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
