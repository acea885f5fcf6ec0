"""The trainer's warm-up as dfo runs it (pure): its argv and environment, and the parsing
of its report and its error output. ``orchestrator.engine.cache_warmup`` runs it."""

from __future__ import annotations

import json
import posixpath
from typing import Sequence

from dfo_contract.errors import ContractError
from dfo_contract.replies import WarmupReport, WarmupShape

from ..common.errors import CacheError

#: how the env's python runs the trainer's warm-up (docs/contracts.md)
WARMUP_ARGS: tuple[str, ...] = ("-m", "trainer", "warmup")
#: flock's exit status when the host's cache lock is held (not one the trainer uses)
LOCK_CONFLICT = 75


def parse_report(data: bytes | str) -> tuple[list[WarmupShape], dict[str, int], float]:
    """The trainer's warm-up report (``WarmupReport``) -> (its shapes, the compile-counter
    totals: the process's, else the shapes' sum, the warm-up's seconds: the whole
    warm-up's, else the shapes' sum)."""
    try:
        rep = WarmupReport.from_json(json.loads(data))
    except ValueError as e:     # not JSON, or not a report (ContractError)
        what = str(e) if isinstance(e, ContractError) else "not JSON"
        raise CacheError(f"the trainer's warm-up report does not read ({what})",
                         hint="check the trainer version in the env (`dfo deploy --check`)") from None
    totals = rep.totals
    if totals is None:
        totals = {}
        for r in rep.records:
            for k, v in r.counters.items():
                totals[k] = totals.get(k, 0) + v
    total_s = rep.seconds if rep.seconds is not None else sum(r.seconds for r in rep.records)
    return list(rep.records), totals, round(total_s, 3)


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
