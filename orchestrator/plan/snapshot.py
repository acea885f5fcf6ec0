"""Compile-cache snapshots: paths, manifest format, verification and plans (pure).

On the host (``<root>`` is the host's root)::

    cache/<key>                 -> symlink to cache/.gens/<key>-<gen>/  (the live cache)
    cache/.gens/<key>-<gen>/    inductor/ (TORCHINDUCTOR_CACHE_DIR), triton/ (TRITON_CACHE_DIR),
                                mega/artifacts.bin (torch.compiler.save_cache_artifacts())
    cache/.used/<key>           touched whenever a run or warm-cache uses the key (last use)
    cache/snapshots/<key>.tar             the cache dirs, paths relative to the gen dir
    cache/snapshots/<key>.manifest.json   written last: a snapshot without one does not exist

The live cache is a symlink so that switching it (after a restore or a warm-up) is one
atomic ``rename(2)``: a half-unpacked or half-warmed directory is never live.

Manifest (``format`` 1; ``dfo_contract.cache_records.Manifest``, read once by
:func:`parse_manifest`, its keys in this order)::

    {"format": 1, "key": "cpu-0123456789abcdef", "components": {"torch.__version__": ...},
     "created": 1700000000.0, "torch": "2.13.0+cpu",
     "files": {"inductor/fxgraph/..": {"sha256": "..", "size": 123}, ...},
     "sizes": {"inductor": N, "triton": N, "mega": N, "total": N},
     "tar": {"name": "<key>.tar", "sha256": "..", "size": N},
     "warmup": {"cold_s": 12.3, "warm_s": 2.1, "shapes": N},      # optional
     "provenance": {...}, "adopted": {...}}    # who built it / adopted it: plan.provenance

A tar holds only regular files and directories under ``inductor/ triton/ mega/`` (relative
names, no ``..``); anything else (symlinks, hard links, devices, fifos) is refused when a
snapshot is made, pushed, restored and listed (``--status``).

Each run works on its own copy of the live cache (:func:`cache_env`,
:func:`seed_run_cache_argvs`), so a crash mid-compile cannot poison the shared one.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, TypeVar

from dfo_contract.cache_records import (MANIFEST_FORMAT, CacheSizes, CacheStatusReply,
                                        FileDigest, Manifest, Provenance, StoredSnapshot, TarRef,
                                        WarmupInfo)
from dfo_contract.codec import decode, encode
from dfo_contract.errors import ContractError
from dfo_contract.markers import last_json_line

from ..common.errors import CacheError
from .cache_key import diff_components, explain_diff
from .provenance import builder
from ..config.host_tree import HostTree
from .probes import Probe, text
from .scripts import remote_source, script_text

R = TypeVar("R")
CACHE_SUBDIRS = ("inductor", "triton", "mega")
MEGA_FILE = "mega/artifacts.bin"

_KEY_RE = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
#: "$1" live cache, "$2" run dir, "$3" the key's last-use stamp file
SEED_SCRIPT = script_text("seed_run_cache.sh")


# --------------------------------------------------------------------------- paths

def check_key_name(key: str) -> str:
    if not _KEY_RE.match(key) or key.startswith("."):
        raise CacheError(f"invalid cache key {key!r}", hint="keys are letters, digits, '.', '_', '-'")
    return key


@dataclass(frozen=True)
class CachePaths:
    """Where one key's cache lives on the host."""

    tree: HostTree
    key: str

    @property
    def live(self) -> str:
        return posixpath.join(self.tree.cache, self.key)

    @property
    def gens(self) -> str:
        return posixpath.join(self.tree.cache, ".gens")

    def gen(self, stamp: str) -> str:
        return posixpath.join(self.gens, f"{self.key}-{stamp}")

    def link_tmp(self, stamp: str) -> str:
        return posixpath.join(self.tree.cache, f".{self.key}.lnk-{stamp}")

    @property
    def used(self) -> str:
        return posixpath.join(self.tree.cache, ".used", self.key)

    @property
    def tar(self) -> str:
        return posixpath.join(self.tree.snapshots, f"{self.key}.tar")

    @property
    def manifest(self) -> str:
        return posixpath.join(self.tree.snapshots, f"{self.key}.manifest.json")

    def tar_tmp(self, stamp: str) -> str:
        return posixpath.join(self.tree.snapshots, f".{self.key}.tar.tmp-{stamp}")


def paths(tree: HostTree, key: str) -> CachePaths:
    return CachePaths(tree, check_key_name(key))


def cache_env(tree: HostTree, key: str, run_dir: str) -> dict[str, str]:
    """The cache env vars for one run: its *own copy* under ``<run_dir>/cache/``
    (seeded from the live cache of ``key`` by :func:`seed_run_cache_argvs`), never
    the shared live cache itself."""
    check_key_name(key)
    base = posixpath.join(run_dir, "cache")
    return {"TORCHINDUCTOR_CACHE_DIR": posixpath.join(base, "inductor"),
            "TRITON_CACHE_DIR": posixpath.join(base, "triton"),
            "DFO_CACHE_KEY": key}


def seed_run_cache_argvs(tree: HostTree, key: str, run_dir: str) -> list[list[str]]:
    """argvs (run in order, on the host) that give ``run_dir`` its own copy of the live
    cache: copy to ``<run_dir>/.cache.tmp``, rename to ``<run_dir>/cache``, stamp last use.
    A full copy (``cp -a``), not hard links: torch and triton do not all write by
    rename, and an in-place write through a hard link would change the snapshot.
    When the key has no live cache the run starts cold with empty dirs.
    Uses a constant ``sh -c`` script (``scripts/seed_run_cache.sh``) with the paths as
    positional parameters."""
    p = paths(tree, key)
    return [["mkdir", "-p", run_dir], ["sh", "-c", SEED_SCRIPT, "dfo-seed-cache", p.live, run_dir, p.used]]


# --------------------------------------------------------------------------- manifest

def sizes_of(files: Mapping[str, FileDigest]) -> CacheSizes:
    by_top = {d: 0 for d in CACHE_SUBDIRS}
    for rel, info in files.items():
        top = rel.split("/", 1)[0]
        by_top[top] = by_top.get(top, 0) + info.size
    return CacheSizes(inductor=by_top["inductor"], triton=by_top["triton"], mega=by_top["mega"],
                      total=sum(i.size for i in files.values()))


def build_manifest(key: str, components: Mapping[str, str], files: Mapping[str, FileDigest],
                   *, tar_sha256: str, tar_size: int, created: float, torch: str | None,
                   warmup: WarmupInfo | None = None,
                   provenance: Provenance | None = None) -> Manifest:
    check_files_shape(encode(files), "new snapshot")
    return Manifest(key=key, components=dict(sorted(components.items())), created=float(created),
                    torch=torch, files=dict(sorted(files.items())), sizes=sizes_of(files),
                    tar=TarRef(name=f"{key}.tar", sha256=tar_sha256, size=int(tar_size)),
                    warmup=warmup, provenance=provenance)


def manifest_bytes(manifest: Manifest) -> bytes:
    return (json.dumps(manifest.to_json(), indent=1, sort_keys=False) + "\n").encode("utf-8")


def _bad(source: str, what: str) -> CacheError:
    return CacheError(f"snapshot manifest {source} is not valid: {what}",
                      hint="take a new snapshot with `dfo warm-cache`")


def check_files_shape(files: Any, source: str) -> None:
    """The ``files`` of a manifest's JSON: relative paths under the cache dirs, each with a
    sha256 and a size."""
    if not isinstance(files, Mapping):
        raise _bad(source, "'files' is not a mapping")
    for rel, info in files.items():
        parts = str(rel).split("/")
        if (not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts)
                or parts[0] not in CACHE_SUBDIRS):
            raise _bad(source, f"file path {rel!r} is not under {'/'.join(CACHE_SUBDIRS)}")
        if (not isinstance(info, Mapping) or not _HEX64.match(str(info.get("sha256", "")))
                or not isinstance(info.get("size"), int) or info["size"] < 0):
            raise _bad(source, f"file {rel!r} lacks a sha256/size")


def parse_manifest(data: bytes | str, source: str) -> Manifest:
    """Parse and validate a manifest's bytes; CacheError (one line) naming what is wrong."""
    try:
        m = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(source, f"not JSON ({e.__class__.__name__})") from None
    return manifest_from_json(m, source)


def manifest_from_json(m: Any, source: str) -> Manifest:
    """Validate a manifest's JSON object and read it (``Manifest``); CacheError (one line)
    naming what is wrong."""
    if not isinstance(m, dict):
        raise _bad(source, "not a JSON object")
    if m.get("format") != MANIFEST_FORMAT:
        raise _bad(source, f"format {m.get('format')!r}, this dfo reads {MANIFEST_FORMAT}")
    key = m.get("key")
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise _bad(source, "no valid 'key'")
    comps = m.get("components")
    if not isinstance(comps, dict) or not all(isinstance(v, str) for v in comps.values()):
        raise _bad(source, "'components' is not a mapping of strings")
    check_files_shape(m.get("files"), source)
    for field in ("provenance", "adopted"):
        if field in m and not (isinstance(m[field], dict) and
                               all(isinstance(v, (str, type(None))) for v in m[field].values())):
            raise _bad(source, f"'{field}' is not a mapping of strings")
    tar = m.get("tar")
    if (not isinstance(tar, dict) or not _HEX64.match(str(tar.get("sha256", "")))
            or not isinstance(tar.get("size"), int)):
        raise _bad(source, "'tar' lacks a sha256/size")
    try:
        return Manifest.from_json(m, what="the manifest")
    except ContractError as e:
        raise _bad(source, str(e).removeprefix("the manifest's ")) from None


# --------------------------------------------------------------------------- verification

def check_key(manifest: Manifest, key: str, components: Mapping[str, str], source: str) -> None:
    """Refuse a snapshot made for another env/config, naming each component that differs."""
    diffs = diff_components(manifest.components, components)
    if manifest.key == key and not diffs:
        return
    if diffs:
        raise CacheError(f"snapshot {source} was made for another environment: {explain_diff(diffs)}",
                         hint="warm a new cache for this env with `dfo warm-cache`")
    raise CacheError(f"snapshot {source} has key {manifest.key}, this env's key is {key}",
                     hint="warm a new cache for this env with `dfo warm-cache`")


def check_tar(manifest: Manifest, observed: FileDigest | None, source: str) -> None:
    """The tar's size and sha256 against the manifest (truncation shows as a size change);
    ``observed`` None: the tar is missing."""
    want = manifest.tar
    if observed is None:
        raise CacheError(f"snapshot {source}: the tar file is missing",
                         hint="pull or take the snapshot again")
    if observed.size != want.size:
        raise CacheError(f"snapshot {source} is truncated or altered: tar is {observed.size} bytes, "
                         f"manifest says {want.size}", hint="pull or take the snapshot again")
    if observed.sha256 != want.sha256:
        raise CacheError(f"snapshot {source} is corrupt: tar sha256 {observed.sha256[:12]} != "
                         f"manifest {want.sha256[:12]}", hint="pull or take the snapshot again")


def file_problems(expected: Mapping[str, FileDigest],
                  observed: Mapping[str, FileDigest]) -> list[str]:
    """Differences between the manifest's files and an unpacked tree's, one string each."""
    out = []
    for rel in sorted(set(expected) | set(observed)):
        e, o = expected.get(rel), observed.get(rel)
        if o is None:
            out.append(f"{rel}: missing")
        elif e is None:
            out.append(f"{rel}: not in the manifest")
        elif o.size != e.size:
            out.append(f"{rel}: {o.size} bytes, manifest says {e.size}")
        elif o.sha256 != e.sha256:
            out.append(f"{rel}: sha256 differs")
    return out


def check_files(manifest: Manifest, observed: Mapping[str, FileDigest], source: str,
                other: Iterable[str] = ()) -> None:
    """The unpacked files against the manifest; ``other`` (symlinks, special files found
    beside them) is always refused."""
    problems = [f"{rel}: not a regular file" for rel in sorted(other)]
    problems += file_problems(manifest.files, observed)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CacheError(f"snapshot {source} fails its checksums: {'; '.join(problems[:3])}{more}",
                         hint="pull or take the snapshot again")


def check_members(refused: str | None, source: str) -> None:
    """A forbidden tar member, as the cache helper's ``scan_tar``/``unpack`` reported it."""
    if refused:
        raise CacheError(f"snapshot {source} refused: {refused}",
                         hint="a snapshot holds only regular files and directories; "
                              "take it again with `dfo warm-cache --rewarm`")


def check_dir_members(other: Iterable[str], source: str) -> None:
    """Before a snapshot is made: the cache dir holds nothing but files and directories."""
    if other := sorted(other):
        more = f" (+{len(other) - 1} more)" if len(other) > 1 else ""
        raise CacheError(f"cannot snapshot {source}: {other[0]} is a symlink or special file{more}",
                         hint="a snapshot holds only regular files and directories; remove it "
                              "and warm again with `dfo warm-cache --rewarm`")


def snapshot_problem(info: StoredSnapshot, key: str) -> str | None:
    """What is wrong with one stored snapshot (from the helper's ``status ROOT verify``):
    manifest unreadable or invalid, tar missing, truncated or corrupt, a forbidden member."""
    if info.error:
        return f"manifest unreadable ({info.error})"
    if info.manifest is None:  # not verified
        return None
    try:
        m = manifest_from_json(info.manifest, f"{key}.manifest.json")
        if m.key != key:
            return f"manifest names key {m.key}"
        check_tar(m, info.tar.digest if info.tar else None, f"{key}.tar")
        check_members(info.refused, f"{key}.tar")
    except CacheError as e:
        return e.message
    return None


# --------------------------------------------------------------------------- plans

@dataclass(frozen=True)
class WarmPlan:
    """What ``dfo warm-cache`` does: ``restore`` from ``source`` (``file``/``store``), or
    ``warm`` (run the trainer's warm-up, then snapshot)."""

    action: str          # "restore" | "warm"
    source: str | None   # "file" | "store" | None
    reason: str


def plan_warm(*, from_file: bool, store_has_key: bool, rewarm: bool = False) -> WarmPlan:
    if from_file:
        return WarmPlan("restore", "file", "restoring the given snapshot")
    if rewarm:
        return WarmPlan("warm", None, "--rewarm: warming from the current live cache")
    if store_has_key:
        return WarmPlan("restore", "store", "a snapshot for this key is in the host's store")
    return WarmPlan("warm", None, "no snapshot for this key yet")


@dataclass(frozen=True)
class CacheEntry:
    """One key on a host, as ``dfo warm-cache --status`` shows it."""

    key: str
    live_size: int | None = None        # bytes in the live cache dir; None = no live cache
    snapshot_size: int | None = None    # bytes of <key>.tar; None = no snapshot
    created: float | None = None        # manifest's created
    last_used: float | None = None      # .used/<key> mtime, or the newest of the above
    built_by: str | None = None         # provenance: host (machine) that built the snapshot
    problem: str | None = None          # why the stored snapshot fails verification (--status)
    #: files of the live cache that cannot be loaded, (path, why) (--status)
    live_damage: tuple[tuple[str, str], ...] = ()

    @property
    def live_problem(self) -> str | None:
        """The live cache's damage in one line (None: none found)."""
        d = self.live_damage
        if not d:
            return None
        shown = ", ".join(f"{p} ({why})" for p, why in d[:3])
        more = f" (+{len(d) - 3} more)" if len(d) > 3 else ""
        return f"its live cache holds {len(d)} file(s) that cannot be loaded: {shown}{more}"

    @property
    def recency(self) -> float:
        return max(x for x in (self.last_used, self.created, 0.0) if x is not None)


def entries_from_status(status: CacheStatusReply) -> list[CacheEntry]:
    """Turn the remote ``status`` op's reply into entries, newest use first."""
    out = []
    for key in sorted(set(status.live) | set(status.snapshots)):
        live, snap = status.live.get(key), status.snapshots.get(key)
        last = status.used.get(key)
        if last is None:
            last = max((x for x in (live.mtime if live else None, snap.mtime if snap else None)
                        if x is not None), default=None)
        out.append(CacheEntry(key=key, live_size=live.size if live else None,
                              snapshot_size=snap.tar_size if snap else None,
                              created=snap.created if snap else None,
                              last_used=last, built_by=builder(snap.provenance) if snap else None,
                              problem=snapshot_problem(snap, key) if snap else None,
                              live_damage=tuple(live.damaged) if live else ()))
    out.sort(key=lambda e: (-e.recency, e.key))
    return out


def plan_prune(entries: Iterable[CacheEntry], keep: int) -> list[str]:
    """Keys to delete so that the newest ``keep`` (by last use) remain."""
    if keep < 0:
        raise CacheError(f"--prune {keep}: expected a count >= 0")
    ordered = sorted(entries, key=lambda e: (-e.recency, e.key))
    return [e.key for e in ordered[keep:]]


# --------------------------------------------------------------------------- remote helper

#: ``orchestrator/remote/cache_tool.py``'s source, run remotely as ``python -c CACHE_TOOL OP
#: ARGS...`` (every value is an argv element; the python may be a system ``python3`` without
#: dfo). Ops: ``hashdir DIR``, ``hashfile FILE``, ``status CACHE_ROOT``, ... Prints one JSON
#: object: the op's record of ``dfo_contract.cache_records``.
CACHE_TOOL = remote_source("cache_tool")


def tool_argv(python: str, op: str, *args: str) -> list[str]:
    return [python, "-c", CACHE_TOOL, op, *args]


def tool_probe(python: str, op: str, *args: str, reply: type[R],
               timeout: float = 600.0) -> Probe[R]:
    """One cache-tool op as a :class:`~.probes.Probe` whose parse gives its ``reply`` record
    (CacheError without one)."""
    return Probe(f"cache-{op}", tuple(tool_argv(python, op, *args)),
                 lambda out: parse_tool(text(out.stdout), f"cache helper {op}", reply),
                 timeout=timeout)


def parse_tool(output: str, what: str, reply: type[R]) -> R:
    """The tool's reply (its last JSON line) as the op's ``reply`` record; CacheError when
    there is none, it is an ``{"error": ...}``, or it is not that record."""
    r = last_json_line(output)
    if not isinstance(r, dict) or "error" in r:
        raise CacheError(f"{what}: the cache helper printed no result",
                         hint="is the env deployed? `dfo deploy`")
    try:
        return decode(reply, r, what=f"{what}'s reply")
    except ContractError as e:
        raise CacheError(f"{what}: {e}", hint="redeploy with `dfo deploy`") from None
