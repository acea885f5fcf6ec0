"""Run identity (pure): run ids that never collide, the exclusive creation of a run's
directory, and what a launch cut off by a dropped connection tells the user
(docs/recovery.md, "Run identity")."""

from __future__ import annotations

import posixpath
import re
import secrets
import time

from ..common.errors import ConnectError


RUN_ID_SUFFIX = re.compile(r"^[0-9a-f]{6}$")


def make_run_id(run_name: str, now: float, suffix: str | None = None) -> str:
    """``<run-name>-<UTC date>-<time>-<6 hex>``: the random suffix keeps two launches of one
    run name in the same second apart (their run directories are also created exclusively)."""
    suffix = secrets.token_hex(3) if suffix is None else suffix
    if not RUN_ID_SUFFIX.match(suffix):
        raise ValueError(f"run id suffix {suffix!r}: expected 6 lowercase hex digits")
    return f"{run_name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{suffix}"


def run_dir_argvs(run_dir: str, *parents: str) -> list[list[str]]:
    """Create the parents (``mkdir -p``), then the run directory itself EXCLUSIVELY (plain
    ``mkdir``: it fails when the directory exists, so no two launches ever share one), then
    any of ``parents`` that lie inside the run directory (your own trainer's checkpoints
    may live there): ``[parents, mine]`` or ``[parents, mine, inside]``."""
    top = run_dir.rstrip("/")
    inside = [p for p in parents if p.rstrip("/") == top or p.startswith(top + "/")]
    outside = [p for p in parents if p not in inside]
    argvs = [["mkdir", "-p", "--", posixpath.dirname(top), *outside], ["mkdir", "--", run_dir]]
    extra = [p for p in inside if p.rstrip("/") != top]
    if extra:
        argvs.append(["mkdir", "-p", "--", *extra])
    return argvs


def cut_off_error(e: ConnectError, host: str, run_id: str | None) -> ConnectError:
    """A launch cut off by a dropped connection may have started its run: say how to check."""
    if run_id:
        return ConnectError(f"launch of run {run_id} on {host} was cut off: {e.message}",
                            hint=f"the run may already be going: check with `dfo status --run "
                                 f"{run_id}` or `dfo logs --run {run_id}` before launching again")
    return ConnectError(f"launch on {host} was cut off before a run was started: {e.message}",
                        hint="check with `dfo status` (a live run is listed) and launch again")
