"""Whether the target has room for a new env, counting what dfo itself left under the root.

``df`` alone is not the answer after a deploy that ran out of space: the half-built env (and
any ``.trash`` dir of an interrupted removal) is removed before the new env is built, and uv
reuses its cache (it hardlinks files from it, so what the cache holds needs no new space).
Those are measured (``RECLAIM_SCRIPT``, asked only when ``df`` looks short) and counted as
available. Pure, apart from the script's text.
"""

from __future__ import annotations

from dataclasses import dataclass

from .probes import Output, text
from .scripts import script_text

#: "$1" root: the sizes of ``<root>/uv-cache`` and the half-built envs (``deploy_reclaim.sh``)
RECLAIM_SCRIPT = script_text("deploy_reclaim.sh")


@dataclass(frozen=True)
class Reclaimable:
    """dfo's own leftovers under the root (KiB): uv's cache, and the half-built envs."""
    uv_cache_kb: int = 0
    partial_kb: int = 0
    partial: tuple[str, ...] = ()     # their names under envs/
    complete_output: bool = False


def parse_reclaim(out: Output) -> Reclaimable:
    vals: dict[str, int] = {}
    names: list[str] = []
    done = False
    for line in text(out.stdout).splitlines():
        key, _, val = line.partition("\t")
        if key in ("uv_cache_kb", "partial_kb") and val.strip().isdigit():
            vals[key] = int(val)
        elif key == "partial" and val:
            names.append(val)
        elif key == "end":
            done = True
    return Reclaimable(vals.get("uv_cache_kb", 0), vals.get("partial_kb", 0), tuple(names), done)


def check_space(df_kb: int | None, need_mb: int, found: Reclaimable, *, host: str,
                root: str) -> str | None:
    """None when free space, plus what is removed first and what uv reuses (at most what the
    env needs), covers ``need_mb``; else the one-line error naming each part."""
    if df_kb is None or need_mb <= 0:
        return None
    free_mb, partial_mb = df_kb // 1024, found.partial_kb // 1024
    reuse_mb = min(found.uv_cache_kb // 1024, need_mb)
    if free_mb + partial_mb + reuse_mb >= need_mb:
        return None
    parts = [f"{free_mb} MB free"]
    if partial_mb:
        parts.append(f"{partial_mb} MB in half-built envs dfo removes first "
                     f"({', '.join(found.partial)})")
    if reuse_mb:
        parts.append(f"{reuse_mb} MB in its uv cache that the install reuses")
    return (f"disk full on {host}: {root} has {' + '.join(parts)}, the env needs about "
            f"{need_mb} MB")
