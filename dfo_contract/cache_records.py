"""The compile cache's records that cross a process, each read and written by
``dfo_contract.codec``: the replies of the cache helper run on a host
(``orchestrator/remote/cache_tool.py``, one JSON object per op; the helper itself stays
stdlib-only and writes these shapes by hand) and a snapshot's manifest
(``cache/snapshots/<key>.manifest.json``, ``orchestrator.plan.snapshot``; who built and who
adopted a snapshot: ``orchestrator.plan.provenance``). Readers use attributes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .codec import decode, encode, named, opt

#: the manifest format this side reads and writes
MANIFEST_FORMAT = 1


# --- the cache helper's replies -------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class FileDigest:
    """A file's ``{"sha256", "size"}`` (a cache file, or a snapshot's tar)."""

    sha256: str
    size: int


@dataclass(frozen=True, kw_only=True)
class HashFileReply:
    """``hashfile FILE``: ``{"sha256", "size"}``, or ``{"missing": true}``."""

    sha256: str | None = None
    size: int | None = None
    missing: bool = False

    @property
    def digest(self) -> FileDigest | None:
        """The file's digest (None: the file is missing)."""
        if self.missing or self.sha256 is None or self.size is None:
            return None
        return FileDigest(sha256=self.sha256, size=self.size)


@dataclass(frozen=True, kw_only=True)
class HashDirReply:
    """``hashdir DIR``: ``{"files": {rel: FileDigest}, "other": [rel...]}`` (symlinks and
    special files, never followed), or ``{"missing": true}``."""

    files: dict[str, FileDigest] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)
    missing: bool = False


@dataclass(frozen=True, kw_only=True)
class UnpackReply(HashDirReply):
    """``unpack TAR DEST``: the unpacked tree as ``hashdir DEST`` answers it, or
    ``{"refused": why}`` (a forbidden member: nothing was written), or ``{"missing": true}``."""

    refused: str | None = None


@dataclass(frozen=True, kw_only=True)
class ScanReply:
    """``scantar TAR`` (and ``cache_tool.scan_tar`` called in this process):
    ``{"members": N}``, ``{"refused": why}`` or ``{"missing": true}``."""

    members: int | None = None
    refused: str | None = None
    missing: bool = False

    @classmethod
    def from_json(cls, obj: Any) -> "ScanReply":
        return decode(cls, obj, what="the cache helper's scantar reply")


@dataclass(frozen=True, kw_only=True)
class HostnameReply:
    """``hostname``: ``{"hostname"}`` (the machine's own name, for a snapshot's provenance)."""

    hostname: str = ""


@dataclass(frozen=True, kw_only=True)
class ScrubReply:
    """``scrub DIR``: ``{"dropped": [[rel, why], ...]}`` (the files deleted because they
    cannot be loaded), or ``{"missing": true}``."""

    dropped: list[tuple[str, str]] = field(default_factory=list)
    missing: bool = False


@dataclass(frozen=True, kw_only=True)
class LiveCache:
    """One key's live cache in ``status``: its bytes, mtime, the generation it points to
    (``target``), whether it is the symlink, and (``verify``) its files that cannot be
    loaded, ``[[rel, why], ...]``."""

    TOLERANT = True

    size: int = 0
    mtime: float | None = None
    target: str = ""
    link: bool = False
    damaged: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class StoredSnapshot:
    """One key's stored snapshot in ``status``: the manifest's mtime and what it says
    (``created``, ``total``, ``warmup``, ``provenance``; ``error``: why it could not be read),
    the tar's size (None: no tar); with ``verify`` also the manifest's JSON object as stored
    (``manifest``, validated on the laptop by ``plan.snapshot.manifest_from_json``), the tar's
    observed digest (``tar``) and its first forbidden member (``refused``). Read tolerant:
    a manifest may say anything, and the laptop reports it."""

    TOLERANT = True

    mtime: float | None = None
    created: float | None = None
    total: int | None = None
    warmup: WarmupInfo | None = None
    provenance: Provenance | None = None
    error: str | None = opt()
    manifest: dict[str, Any] | None = opt()
    tar_size: int | None = None
    tar: HashFileReply | None = opt()
    refused: str | None = None


@dataclass(frozen=True, kw_only=True)
class CacheStatusReply:
    """``status CACHE_ROOT [verify]``: the live caches and stored snapshots by key, each
    key's last use (``.used/<key>``'s mtime) and the leftovers of interrupted warm-ups and
    restores (``stale``, relative to the cache root)."""

    TOLERANT = True

    live: dict[str, LiveCache] = field(default_factory=dict)
    snapshots: dict[str, StoredSnapshot] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)
    stale: list[str] = field(default_factory=list)


# --- the snapshot manifest ------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class TarRef:
    """The manifest's ``tar``: ``{"name": "<key>.tar", "sha256", "size"}``."""

    name: str = ""
    sha256: str
    size: int


@dataclass(frozen=True, kw_only=True)
class CacheSizes:
    """The manifest's ``sizes``: bytes of the files under each cache dir, and in all."""

    inductor: int = 0
    triton: int = 0
    mega: int = 0
    total: int = 0


@dataclass(frozen=True, kw_only=True)
class WarmupInfo:
    """The manifest's ``warmup``: the warm-up's seconds on the cache as it was (``cold_s``)
    and on the saved cache (``warm_s``), the shapes compiled, and each run's compile
    counters."""

    cold_s: float | None = None
    warm_s: float | None = None
    shapes: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    warm_counters: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Who built a snapshot (the manifest's ``provenance``): the host as dfo's inventory
    names it, the machine's own name, the env (profile and lock), the cache key, python,
    torch and dfo versions, when (UTC). Keys it does not know are kept (``extra``)."""

    host: str | None = None
    machine: str | None = None
    env: str | None = None
    cache_key: str | None = None
    python: str | None = None
    torch: str | None = None
    dfo: str | None = None
    created_utc: str | None = None
    extra: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Adoption:
    """A host's explicit adoption of a snapshot another built (the manifest's ``adopted``,
    in that host's store copy only): the host and machine, whom it came from (``from``),
    how it was trusted, when (UTC). Keys it does not know are kept (``extra``)."""

    host: str | None = None
    machine: str | None = None
    source: str | None = named("from", None)
    how: str | None = None
    at_utc: str | None = None
    extra: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A snapshot's manifest (``format`` 1), written last beside its tar: the key and its
    components, when and with which torch, every file's digest, the sizes, the tar's digest,
    the warm-up's figures, who built it and (a store copy) who adopted it. Keys it does not
    know are kept (``extra``)."""

    format: int = MANIFEST_FORMAT
    key: str
    components: dict[str, str]
    created: float = 0.0
    torch: str | None = None
    files: dict[str, FileDigest]
    sizes: CacheSizes = field(default_factory=CacheSizes)
    tar: TarRef
    warmup: WarmupInfo | None = opt()
    provenance: Provenance | None = opt()
    adopted: Adoption | None = opt()
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any, *, what: str = "a snapshot manifest") -> "Manifest":
        return decode(cls, obj, what=what)
