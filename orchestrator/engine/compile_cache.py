"""The compile cache of one host as a managed artifact (``CacheManager``): its key, and the
snapshot store's commands (restore, push, pull, status, prune). The store's paths, live
generation and commit are ``cache_store`` (``CacheStore``, built here once and given to the
warm-up too); the warm-up that fills a generation is ``cache_warmup``; ``dfo warm-cache``'s
choice of mode is ``cache_command``.

Decisions (key, manifest checks, plans) are pure, in ``orchestrator.plan.cache_key`` and
``orchestrator.plan.snapshot``; this module carries them out through a ``Transport``.
Every remote command is an argv list: ``tar``, ``mv``, ``ln``, ``rm``, ``mkdir`` and the
env's python running a constant script (``CACHE_TOOL``/``SOURCE_HASH_SCRIPT``) with the
values as argv elements.

Nothing half-made is ever live: a warm-up or a restore builds a new generation
directory ``cache/.gens/<key>-<gen>`` and only then switches the ``cache/<key>``
symlink to it with one rename; a snapshot's tar is written under a temporary name and
renamed, and its manifest is written last.
"""

from __future__ import annotations

import logging
import os
import posixpath
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from dfo_contract.cache_records import (CacheStatusReply, FileDigest, HashFileReply, Manifest,
                                        ScanReply, ScrubReply, UnpackReply, WarmupInfo)
from dfo_contract.env_fingerprint import EnvFingerprint
from dfo_contract.fsio import atomic_write_bytes, sha256_file
from dfo_contract.trainer_config import TrainerConfig

from ..common.errors import CacheError, ConfigError, DfoError, NotFoundError
from ..plan import cache_key as ck
from ..plan import snapshot as sn
from ..plan.init_from import effective, init_from_probe
from ..plan.provenance import Trust, adoption_record, check_trust
from ..config.host_tree import HostTree
from ..transport import run_probe
from ..transport.base import Transport
from ..transport.local import LocalTransport
from .cache_store import CacheStore
from .cache_warmup import CacheWarmup, Event, WarmResult

log = logging.getLogger("dfo")

__all__ = ["CacheManager", "local_snapshot_files"]


def _noop(kind: str, data: Any) -> None:
    pass


# --------------------------------------------------------------------------- the manager

class CacheManager:
    """Compile-cache operations on one host (through its transport): the key, restore,
    push, pull, status, prune. It builds the host's ``store`` (``CacheStore``: paths, the
    live generation, the store's commit) and gives it to its ``warmup`` (``CacheWarmup``:
    the warm-up into a new generation); ``warm`` and ``adopt`` here are that object's."""

    def __init__(self, transport: Transport, tree: HostTree, *, host: str | None = None,
                 events: Event = _noop, timeout: float | None = None,
                 trusted_sources: Sequence[str] = ()):
        self.transport = transport
        self.tree = tree
        self.host = host or transport.name
        self._events = events
        self._timeout = timeout
        self._trusted_sources = tuple(trusted_sources)
        self.store = CacheStore(transport, tree, self.host, timeout=timeout)
        self.warmup = CacheWarmup(self.store, transport, events=events)

    def warm(self, key: ck.CacheKey, config_bytes: bytes, overrides: Sequence[tuple[str, str]],
             *, measure: bool = True, fresh: bool = False) -> WarmResult:
        return self.warmup.warm(key, config_bytes, overrides, measure=measure, fresh=fresh)

    def adopt(self, cache_dir: str, key: ck.CacheKey, *,
              warmup: WarmupInfo | None = None) -> Manifest:
        return self.warmup.adopt(cache_dir, key, warmup=warmup)

    def _trust(self, trust_other_hosts: bool = False) -> Trust:
        return Trust(host=self.host, machine=self.store.machine,
                     trusted_sources=self._trusted_sources, trust_other_hosts=trust_other_hosts)

    # -- the key -----------------------------------------------------------------------------
    def fingerprint(self) -> EnvFingerprint:
        """envs/current's fingerprint.json, the key's first part."""
        return self.store.fingerprint()

    def trainer_source(self) -> str:
        probe = ck.source_hash_probe(self.store.python, timeout=self._timeout or 600.0)
        r = self.transport.run(list(probe.argv), timeout=probe.timeout)
        if r.exit_code not in (0, 3):  # 3: a package is missing (parse says None)
            r.check("hashing the trainer source")
        combined = probe.parse(r)
        if combined is None:
            raise CacheError(f"the env on {self.host} has no trainer or dfo_contract package "
                             f"(or an older dfo wheel)", hint="redeploy with `dfo deploy`")
        return combined

    def _file_hash(self, path: str) -> str | None:
        """The sha256 of a file on the host (None: it is missing)."""
        digest = self.store.tool("hashfile", path, reply=HashFileReply).digest
        return digest.sha256 if digest else None

    def _run_config(self, config: TrainerConfig, *, source: str | None = None) -> TrainerConfig:
        """``config`` as the trainer runs it: with ``model.init_from``, the settings of that
        drafter directory on the host (its config.json, read by ``plan.init_from``'s probe;
        which keys the file or an override set: ``config.explicit_keys``), as ``dfo launch``
        applies them; ``source``: the config file."""
        path = config.model.init_from
        if not path:
            return config
        probe = init_from_probe(path)
        r = self.transport.run(list(probe.argv), timeout=self._timeout or probe.timeout)
        r.check(f"reading {path}/config.json on {self.host}")
        return effective(config, probe.parse(r), host=self.host, config=source)

    def key(self, config: TrainerConfig, *, source: str | None = None) -> ck.CacheKey:
        """The cache key of ``config`` (the trainer's config in force: ``_run_config``),
        computed as ``dfo launch`` computes it (``cache_key.config_key``)."""
        config = self._run_config(config, source=source)
        return ck.config_key(self.store.fingerprint(), config,
                             trainer_source=self.trainer_source(), file_hash=self._file_hash)

    # -- restore -----------------------------------------------------------------------------
    def read_manifest_remote(self, p: sn.CachePaths) -> Manifest | None:
        """The manifest of the stored snapshot at ``p``; None when there is none."""
        return self.store.read_manifest(p)

    def restore_from_store(self, key: ck.CacheKey, *, trust_other_hosts: bool = False) -> Manifest:
        """Verify the host store's snapshot for ``key`` and make it the live cache. A
        snapshot neither built nor explicitly adopted here needs ``trust_other_hosts`` (or its
        builder in ``trusted_sources``)."""
        p = sn.paths(self.tree, key.key)
        m = self.store.read_manifest(p)
        if m is None:
            raise NotFoundError(f"no snapshot for key {key.key} on {self.host}",
                                hint="warm one with `dfo warm-cache`")
        source = f"{self.host}:{p.tar}"
        sn.check_key(m, key.key, key.components, source)
        check_trust(m, self._trust(trust_other_hosts), source, stored=True)
        self._restore(p, m, p.tar, key, source)
        return m

    def _restore(self, p: sn.CachePaths, m: Manifest, tar: str, key: ck.CacheKey,
                 source: str) -> None:
        sn.check_key(m, key.key, key.components, source)
        self._events("stage", {"stage": "verify", "what": source})
        sn.check_tar(m, self.store.tool("hashfile", tar, reply=HashFileReply).digest, source)
        stamp = self.store.stamp()
        gen = p.gen(stamp)
        self._events("stage", {"stage": "unpack", "what": gen})
        try:
            self.store.run(["mkdir", "-p", "--", gen], "creating the cache dir")
            # the helper checks every member (regular files and dirs only), then extracts
            # without following links or writing outside ``gen``, then hashes
            got = self.store.tool("unpack", tar, gen, reply=UnpackReply)
            sn.check_members(got.refused, source)
            sn.check_files(m, got.files, source, other=got.other)
        except BaseException:
            self.store.rm(gen)
            raise
        self.store.switch(p, gen, stamp)

    def push(self, local_tar: Path, key: ck.CacheKey, *, restore: bool = True,
             trust_other_hosts: bool = False) -> Manifest:
        """Verify a local snapshot (manifest beside it: key, tar checksum, members, and who
        built it), upload it into the host's store (temporary name, then rename; manifest
        last, recording an explicit adoption) and restore it."""
        local_tar, local_manifest = local_snapshot_files(local_tar)
        source = str(local_tar)
        m = sn.parse_manifest(local_manifest.read_bytes(), str(local_manifest))
        sn.check_key(m, key.key, key.components, source)
        sn.check_tar(m, _hash_local(local_tar), source)
        sn.check_members(_scan_local(local_tar).refused, source)
        how = check_trust(m, self._trust(trust_other_hosts), source)
        m = adoption_record(m, self._trust(trust_other_hosts), how, time.time())
        p = sn.paths(self.tree, key.key)
        stamp = self.store.stamp()
        tmp = p.tar_tmp(stamp)
        self._events("stage", {"stage": "upload", "what": source, "bytes": local_tar.stat().st_size})
        self.store.run(["mkdir", "-p", "--", self.tree.snapshots], "creating the snapshot store")
        try:
            self.transport.put(local_tar, tmp, mode=0o644)
            if restore:
                self._restore(p, m, tmp, key, source)
        except BaseException:
            self.store.rm(tmp)
            raise
        self.store.commit(p, tmp, m)
        return m

    def pull(self, key: str, dest: Path) -> tuple[Path, Path]:
        """Copy the host's snapshot for ``key`` (verified) to ``dest`` (a dir or a .tar path)."""
        p = sn.paths(self.tree, key)
        m = self.store.read_manifest(p)
        if m is None:
            have = sorted(e.key for e in self.status()[0] if e.snapshot_size is not None)
            raise NotFoundError(f"no snapshot for key {key} on {self.host}",
                                hint=("snapshots: " + ", ".join(have)) if have
                                else "there are no snapshots; warm one with `dfo warm-cache`")
        tar_path = _pull_target(Path(dest), key)
        man_path = tar_path.with_name(tar_path.name[: -len(".tar")] + ".manifest.json")
        self._events("stage", {"stage": "download", "what": f"{self.host}:{p.tar}"})
        part = tar_path.with_name(f".{tar_path.name}.dfo-pull")
        try:
            self.transport.get_file(p.tar, part)
            sn.check_tar(m, _hash_local(part), f"{self.host}:{p.tar}")
            sn.check_members(_scan_local(part).refused, f"{self.host}:{p.tar}")
            part.replace(tar_path)  # only a verified tar takes the name
            atomic_write_bytes(man_path, sn.manifest_bytes(m))
        except OSError as e:
            raise ConfigError(f"--pull {dest}: cannot write {e.filename or tar_path}: "
                              f"{e.strerror or e}", hint="pull into a writable directory") from None
        finally:
            try:
                part.unlink(missing_ok=True)
            except OSError:     # a read-only DEST: nothing was written there to remove
                pass
        return tar_path, man_path

    def nearest_snapshot(self, key: ck.CacheKey) -> tuple[str, list[tuple[str, str, str]]] | None:
        """The stored snapshot whose components differ least from ``key``'s, and how
        (to explain why a start is cold, e.g. ``torch.version.cuda: snapshot 12.8, env 13.0``)."""
        _, raw = self.status()
        best = None
        for other in sorted(raw.snapshots):
            if other == key.key:
                continue
            try:
                m = sn.parse_manifest(self.transport.get(sn.paths(self.tree, other).manifest), other)
            except DfoError:
                continue
            diffs = ck.diff_components(m.components, key.components)
            if best is None or len(diffs) < len(best[1]):
                best = (other, diffs)
        return best

    # -- status / prune ------------------------------------------------------------------------
    def status(self, *, verify: bool = False) -> tuple[list[sn.CacheEntry], CacheStatusReply]:
        """The host's keys, and the helper's reply; ``verify`` also checks every stored
        snapshot (manifest, tar size and sha256, members) and sets each entry's ``problem``."""
        raw = self.store.helper("status", self.tree.cache, *(["verify"] if verify else []),
                                reply=CacheStatusReply, what="cache status")
        return sn.entries_from_status(raw), raw

    def scrub_live(self, key: str) -> list[tuple[str, str]]:
        """Delete the files of ``key``'s live cache that cannot be loaded (the cache
        helper's ``scrub``); (path, why) for each."""
        raw = self.store.helper("scrub", sn.paths(self.tree, key).live, reply=ScrubReply,
                                what="cache scrub")
        return list(raw.dropped)

    def prune(self, keep: int) -> list[str]:
        entries, raw = self.status()
        doomed = sn.plan_prune(entries, keep)
        for key in doomed:
            p = sn.paths(self.tree, key)
            live = raw.live.get(key)
            target = live.target if live else None
            # the manifest first: from then on the snapshot does not exist
            self.store.rm(p.manifest)
            self.store.rm(p.tar, p.live, p.used, *([target] if target else []))
        # leftovers of interrupted warm-ups/restores (never live)
        stale = [posixpath.join(self.tree.cache, s) for s in raw.stale]
        self.store.rm(*stale)
        return doomed


def local_snapshot_files(path: Path) -> tuple[Path, Path]:
    """(tar, manifest) of a local snapshot given either file's path."""
    path = Path(path)
    name = path.name
    if name.endswith(".manifest.json"):
        stem = name[: -len(".manifest.json")]
        tar, man = path.with_name(stem + ".tar"), path
    elif name.endswith(".tar"):
        tar, man = path, path.with_name(name[: -len(".tar")] + ".manifest.json")
    else:
        raise ConfigError(f"{path}: expected a snapshot's .tar or .manifest.json")
    if not man.is_file():
        raise NotFoundError(f"snapshot manifest {man} does not exist",
                            hint="a snapshot is <key>.tar plus <key>.manifest.json beside it")
    if not tar.is_file():
        raise CacheError(f"snapshot {tar} is missing (its manifest is {man})",
                         hint="pull it again with `dfo warm-cache --pull`")
    return tar, man


def _hash_local(path: Path) -> FileDigest:
    return FileDigest(sha256=sha256_file(path), size=Path(path).stat().st_size)


def _scan_local(path: Path) -> ScanReply:
    """The cache helper's member check (``scantar``) of a tar on this machine: the helper
    runs here as it runs on a host (``python -c SOURCE``), with this interpreter."""
    return run_probe(LocalTransport(), sn.tool_probe(sys.executable, "scantar", str(path),
                                                     reply=ScanReply))


def _pull_target(dest: Path, key: str) -> Path:
    """Where ``--pull DEST`` puts the tar: ``DEST/<key>.tar`` for a directory (made if
    missing), ``DEST`` itself for a path ending in ``.tar``. One-line errors otherwise."""
    try:
        if dest.is_dir() or str(dest).endswith(os.sep) or not dest.name.endswith(".tar"):
            if dest.exists() and not dest.is_dir():
                raise ConfigError(f"--pull {dest}: exists and is not a directory",
                                  hint="name a directory, or a path ending in .tar")
            dest.mkdir(parents=True, exist_ok=True)
            return dest / f"{key}.tar"
        if dest.is_dir():
            raise ConfigError(f"--pull {dest}: is a directory", hint="name a new .tar path")
        dest.parent.mkdir(parents=True, exist_ok=True)
        return dest
    except OSError as e:
        raise ConfigError(f"--pull {dest}: cannot create {e.filename or dest}: {e.strerror or e}",
                          hint="pull into a writable directory") from None
