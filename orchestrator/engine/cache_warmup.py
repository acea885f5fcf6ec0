"""A warm-up of the compile cache: run the trainer's warm-up into a new cache generation,
measure it, and snapshot it; or adopt a cache dir made elsewhere on the host
(``CacheWarmup``, held by ``compile_cache.CacheManager``; it is given the host's
``cache_store.CacheStore``, the transport the warm-up streams through, and the progress
callback). ``WarmResult``: what one warm-cache did."""

from __future__ import annotations

import logging
import posixpath
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from dfo_contract.cache_records import HashDirReply, HashFileReply, Manifest, WarmupInfo
from dfo_contract.codec import encode
from dfo_contract.replies import WarmupShape
from dfo_contract.trainer_markers import read_marker

from .. import __version__
from ..common.errors import CacheError, ConfigError, LockHeldError, RemoteCommandError
from ..plan import cache_key as ck
from ..plan import snapshot as sn
from ..plan.provenance import build_provenance
from ..plan.trainer_warmup import LOCK_CONFLICT, parse_report, warmup_argv, warmup_env, warmup_error_line
from ..transport.base import Transport
from .cache_store import CacheStore

log = logging.getLogger("dfo")

#: progress of a cache command: (kind, data), e.g. ("stage", {"stage": "verify", ...}); a
#: "marker" is the trainer's typed marker (``dfo_contract.trainer_markers``)
Event = Callable[[str, Any], None]

@dataclass
class WarmResult:
    """What one ``dfo warm-cache`` did, for the table and ``--json``."""

    host: str
    key: str
    action: str                       # "restored" | "warmed" | "pushed" | "pulled"
    source: str | None = None         # where a restored snapshot came from
    records: list[WarmupShape] = field(default_factory=list)  # per device+shape
    counters: dict[str, int] = field(default_factory=dict)  # totals of the warm-up
    cold_s: float | None = None       # warm-up seconds on the cache as it was
    warm_s: float | None = None       # warm-up seconds on the saved cache (check run)
    warm_counters: dict[str, int] = field(default_factory=dict)
    snapshot_size: int | None = None  # bytes of the tar
    cache_size: int | None = None     # bytes of the files in it
    seconds: float = 0.0              # wall time of the command
    manifest: str | None = None
    tar: str | None = None
    note: str | None = None           # e.g. why there was no snapshot for this key

    @property
    def saved_s(self) -> float | None:
        if self.cold_s is None or self.warm_s is None:
            return None
        return round(self.cold_s - self.warm_s, 3)

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["records"] = [encode(r) for r in self.records]
        d["saved_s"] = self.saved_s
        return d


class CacheWarmup:
    """Warm-ups and adoptions into ``store`` (the host's ``CacheStore``); the trainer's
    warm-up runs through ``transport``; progress goes to ``events(kind, data)``."""

    def __init__(self, store: CacheStore, transport: Transport, *, events: Event):
        self.store = store
        self.transport = transport
        self.events = events

    def warm(self, key: ck.CacheKey, config_bytes: bytes, overrides: Sequence[tuple[str, str]],
             *, measure: bool = True, fresh: bool = False) -> WarmResult:
        """Run the trainer's warm-up into a new generation of the key's cache (seeded from
        the live one unless ``fresh``), switch it live, then (``measure``) run the warm-up
        again on a throwaway copy to record the warm figures, and save a snapshot."""
        p = self.store.paths(key.key)
        stamp = self.store.stamp()
        gen = p.gen(stamp)
        work = posixpath.join(self.store.tree.cache, ".work", f"{key.key}-{stamp}")
        cfg_path = posixpath.join(work, "config.yaml")
        self.store.run(["mkdir", "-p", "--", work, posixpath.join(gen, "mega")],
                       "creating the cache dirs")
        try:
            # no file: the trainer's defaults plus the overrides (an empty YAML mapping)
            self.transport.put(config_bytes or b"{}\n", cfg_path, mode=0o644)
            live = None if fresh else self.store.live_target(p)
            if live:
                self.store.run(["cp", "-a", "--", live + "/.", gen], "copying the live cache")
            self.events("stage", {"stage": "warmup", "what": "cold" if not live else "top-up"})
            records, counters, cold_s = self._warmup(gen, cfg_path, overrides,
                                                     posixpath.join(work, "report-cold.json"),
                                                     save_mega=posixpath.join(gen, sn.MEGA_FILE))
            warm_s: float | None = None
            warm_counters: dict[str, int] = {}
            if measure:
                check = p.gen(stamp + "-check")
                try:
                    self.store.run(["cp", "-a", "--", gen + "/.", check],
                                   "copying the cache for the check run")
                    self.events("stage", {"stage": "check", "what": "warm-up on the saved cache"})
                    _, warm_counters, warm_s = self._warmup(check, cfg_path, overrides,
                                                            posixpath.join(work, "report-warm.json"))
                finally:
                    self.store.rm(check)
            res = WarmResult(host=self.store.host, key=key.key, action="warmed", records=records,
                             counters=counters, cold_s=cold_s, warm_s=warm_s,
                             warm_counters=warm_counters)
            self.events("stage", {"stage": "snapshot", "what": p.tar})
            m = self._save(p, gen, key, stamp, res)
        except BaseException:
            self.store.rm(gen)
            raise
        finally:
            self.store.rm(work)
        self.store.switch(p, gen, stamp)
        res.snapshot_size = m.tar.size
        res.cache_size = m.sizes.total
        res.manifest, res.tar = p.manifest, p.tar
        return res

    def adopt(self, cache_dir: str, key: ck.CacheKey, *, warmup: WarmupInfo | None = None) -> Manifest:
        """Take an existing cache dir on the host (``inductor/``, ``triton/``, ``mega/``
        inside), made in this env for this key, as a new generation: copy it, snapshot
        it, make it live. The source dir is not changed."""
        p = self.store.paths(key.key)
        stamp = self.store.stamp()
        gen = p.gen(stamp)
        self.store.run(["mkdir", "-p", "--", gen], "creating the cache dir")
        try:
            self.store.run(["cp", "-a", "--", cache_dir.rstrip("/") + "/.", gen], f"copying {cache_dir}")
            res = WarmResult(host=self.store.host, key=key.key, action="adopted",
                             cold_s=warmup.cold_s if warmup else None,
                             warm_s=warmup.warm_s if warmup else None)
            m = self._save(p, gen, key, stamp, res)
        except BaseException:
            self.store.rm(gen)
            raise
        self.store.switch(p, gen, stamp)
        return m

    def _warmup(self, cache_dir: str, cfg_path: str, overrides: Sequence[tuple[str, str]],
                report: str, *, save_mega: str | None = None) -> tuple[list[WarmupShape], dict[str, int], float]:
        env = warmup_env(cache_dir)
        # one warm-up at a time per host (flock exits LOCK_CONFLICT at once when another holds it)
        lock = posixpath.join(self.store.tree.locks, "cache.lock")
        self.store.run(["mkdir", "-p", "--", self.store.tree.locks], "creating the locks dir")
        argv = ["flock", "-n", "-E", str(LOCK_CONFLICT), lock,
                *warmup_argv(self.store.python, cfg_path, overrides, report, save_mega=save_mega)]
        tail: list[str] = []

        def on_line(line: str) -> None:
            m = read_marker(line)
            if m is not None:
                self.events("marker", m)      # a typed trainer marker
                return
            tail.append(line)
            del tail[:-30]
            log.debug("warmup: %s", line)
            self.events("line", {"line": line})

        r = self.transport.stream(argv, on_line, env=env, cwd=self.store.tree.root,
                                timeout=self.store.timeout)
        if r.exit_code == LOCK_CONFLICT:
            raise LockHeldError(f"another warm-up holds {lock} on {self.store.host}",
                                hint="wait for the other `dfo warm-cache` to finish")
        if r.exit_code != 0:
            last = warmup_error_line(tail)
            msg = f"the trainer's warm-up on {self.store.host} exited {r.exit_code}" + (f": {last}" if last else "")
            if r.exit_code == 2:
                raise ConfigError(msg, hint="fix the trainer config (see `python -m trainer warmup --help`)")
            hint = None
            if "InvalidCxxCompiler" in last or "C++ compiler" in last:
                hint = "inductor on CPU needs a C++ compiler on the host: install g++ there"
            raise RemoteCommandError(msg, hint=hint, exit_status=r.exit_code, stderr="\n".join(tail))
        return parse_report(self.transport.get(report))

    def _save(self, p: sn.CachePaths, gen: str, key: ck.CacheKey, stamp: str,
              res: WarmResult) -> Manifest:
        """Snapshot ``gen``: tar under a temporary name, rename; manifest written last."""
        self.store.run(["mkdir", "-p", "--", self.store.tree.snapshots], "creating the snapshot store")
        for sub in ("inductor", "triton", "mega"):
            self.store.run(["mkdir", "-p", "--", posixpath.join(gen, sub)], "creating the cache dirs")
        listing = self.store.tool("hashdir", gen, reply=HashDirReply)
        sn.check_dir_members(listing.other, f"{self.store.host}:{gen}")
        tmp = p.tar_tmp(stamp)
        try:
            self.store.run(["tar", "-cf", tmp, "-C", gen, "--", "inductor", "triton", "mega"],
                           "writing the snapshot tar")
            tar_info = self.store.tool("hashfile", tmp, reply=HashFileReply).digest
            if tar_info is None:
                raise CacheError(f"the snapshot tar {tmp} on {self.store.host} vanished as "
                                 f"it was written", hint="warm again with `dfo warm-cache`")
            fp_torch = key.components.get("torch.__version__")
            now = time.time()
            prov = build_provenance(host=self.store.host, machine=self.store.machine,
                                    fingerprint=self.store.fingerprint(),
                                    key=key.key, created=now, dfo=__version__)
            m = sn.build_manifest(key.key, key.components, listing.files,
                                  tar_sha256=tar_info.sha256, tar_size=tar_info.size, created=now,
                                  torch=fp_torch, provenance=prov,
                                  warmup=WarmupInfo(cold_s=res.cold_s, warm_s=res.warm_s,
                                                    shapes=len(res.records),
                                                    counters=dict(res.counters),
                                                    warm_counters=dict(res.warm_counters)))
        except BaseException:
            self.store.rm(tmp)
            raise
        self.store.commit(p, tmp, m)
        return m
