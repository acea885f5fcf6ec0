"""The trainer's environment, read in one place.

``read_env()`` reads every environment variable the trainer consults -- the supervisor's
(names in ``dfo_contract.envvars``: ``DFO_ATTEMPT``, ``DFO_RUN_DIR``, ``DFO_RUN_ID``,
``DFO_CACHE_KEY``, ``DFO_CACHE_DIR``, ``DFO_FAULT``, ``DFO_NODE_RANK``, ``DFO_SPAWN_T``) and
torchrun's (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) -- into a frozen ``Env``. The entry
points (``trainer.train.loop.train``, ``trainer.train.compile_only.main``) read it when they
start, into the process's ``trainer.core.runtime.Runtime``, and pass that down: the layouts
take it (``trainer.parallel.make_layout(cfg, rt)``), fault injection is given the attempt.

Torch-free, and below every other module of the trainer: it imports none of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from dfo_contract import envvars
from dfo_contract.faultspec import parse_attempt
from dfo_contract.procs import process_start


@dataclass(frozen=True)
class Env:
    """The environment as the trainer sees it (``read_env``)."""
    attempt: int = 1                   # $DFO_ATTEMPT (1-based; 1 when unset or malformed)
    run_dir: str | None = None         # $DFO_RUN_DIR: run.dir's default
    run_id: str | None = None          # $DFO_RUN_ID
    cache_key: str | None = None       # $DFO_CACHE_KEY
    cache_dir: str | None = None       # $DFO_CACHE_DIR
    fault: str | None = None           # $DFO_FAULT: the fault spec when --fault.spec is unset
    rank: int | None = None            # torchrun's $RANK (None: not under torchrun)
    world_size: int | None = None      # torchrun's $WORLD_SIZE
    local_rank: int = 0                # torchrun's $LOCAL_RANK
    node_rank: int | None = None       # $DFO_NODE_RANK: dfo's node index, 0 = head (multi-node)
    spawn_t: float | None = None       # $DFO_SPAWN_T: when the supervisor started this attempt

    @property
    def under_torchrun(self) -> bool:
        return self.rank is not None and self.world_size is not None

    @property
    def claims_main(self) -> bool:
        """Whether this process is the one that writes (ddp's main rank): local rank 0 of
        the head node (``DFO_NODE_RANK=0``); without ``DFO_NODE_RANK``, global rank 0 (or
        the only process). Layouts confirm it across ranks (trainer.parallel.ddp)."""
        if self.node_rank is None:
            return self.rank in (None, 0)
        return self.node_rank == 0 and self.local_rank == 0


def _nonempty(v: str | None) -> str | None:
    return v if v is not None and v.strip() else None


def _int_or_none(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def read_env(environ: Mapping[str, str] | None = None) -> Env:
    """The one place the trainer reads environment variables."""
    e = os.environ if environ is None else environ
    return Env(attempt=parse_attempt(e.get(envvars.ATTEMPT)),
               run_dir=_nonempty(e.get(envvars.RUN_DIR)),
               run_id=_nonempty(e.get(envvars.RUN_ID)),
               cache_key=_nonempty(e.get(envvars.CACHE_KEY)),
               cache_dir=_nonempty(e.get(envvars.CACHE_DIR)),
               fault=_nonempty(e.get(envvars.FAULT)),
               rank=_int_or_none(e.get("RANK")),
               world_size=_int_or_none(e.get("WORLD_SIZE")),
               local_rank=_int_or_none(e.get("LOCAL_RANK")) or 0,
               node_rank=_node_rank(e.get(envvars.NODE_RANK)),
               spawn_t=_float_or_none(e.get(envvars.SPAWN_T)))


def _float_or_none(v: str | None) -> float | None:
    try:
        return float(v) if v else None
    except ValueError:
        return None


def process_start_t() -> float | None:
    """This process's start (epoch seconds) from /proc; None where there is no /proc."""
    ticks = process_start("self")
    if ticks is None:
        return None
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    import time

    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def _node_rank(v: str | None) -> int | None:
    """$DFO_NODE_RANK: a non-negative integer, or None when unset/empty; anything else is
    a config error (a node that cannot tell whether it is the head must not guess)."""
    s = _nonempty(v)
    if s is None:
        return None
    n = _int_or_none(s.strip())
    if n is None or n < 0:
        from dfo_contract.exitcodes import TrainerConfigError

        raise TrainerConfigError(f"env: {envvars.NODE_RANK}={v!r} is not a node index "
                                 "(0 for the head node, 1.. for the others)")
    return n
