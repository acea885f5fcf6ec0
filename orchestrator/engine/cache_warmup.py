"""A warm-up of the compile cache: run the trainer's warm-up into a new cache generation,
measure it, and snapshot it; or adopt a cache dir made elsewhere on the host
(``CacheWarmup``, held by ``compile_cache.CacheManager`` and given it: its transport,
layout, events and its public steps ``run``, ``rm``, ``tool``, ``stamp``, ``live_target``,
``switch``, ``store``, ``fingerprint``). ``WarmResult``: what one warm-cache did."""

from __future__ import annotations

import logging
import posixpath
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from dfo_contract.codec import encode
from dfo_contract.replies import WarmupShape
from dfo_contract.trainer_markers import read_marker

from .. import __version__
from ..common.errors import ConfigError, LockHeldError, RemoteCommandError
from ..plan import cache_key as ck
from ..plan import snapshot as sn
from ..plan.provenance import build_provenance
from ..plan.trainer_warmup import LOCK_CONFLICT, parse_report, warmup_argv, warmup_env, warmup_error_line

log = logging.getLogger("dfo")

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
    """Warm-ups and adoptions into the cache of ``cache`` (a ``CacheManager``)."""

    def __init__(self, cache):
        self.cache = cache

    def warm(self, key: ck.CacheKey, config_bytes: bytes, overrides: Sequence[tuple[str, str]],
             *, measure: bool = True, fresh: bool = False) -> WarmResult:
        """Run the trainer's warm-up into a new generation of the key's cache (seeded from
        the live one unless ``fresh``), switch it live, then (``measure``) run the warm-up
        again on a throwaway copy to record the warm figures, and save a snapshot."""
        p = sn.paths(self.cache.tree, key.key)
        stamp = self.cache.stamp()
        gen = p.gen(stamp)
        work = posixpath.join(self.cache.tree.cache, ".work", f"{key.key}-{stamp}")
        cfg_path = posixpath.join(work, "config.yaml")
        self.cache.run(["mkdir", "-p", "--", work, posixpath.join(gen, "mega")],
                       "creating the cache dirs")
        try:
            # no file: the trainer's defaults plus the overrides (an empty YAML mapping)
            self.cache.transport.put(config_bytes or b"{}\n", cfg_path, mode=0o644)
            live = None if fresh else self.cache.live_target(p)
            if live:
                self.cache.run(["cp", "-a", "--", live + "/.", gen], "copying the live cache")
            self.cache.events("stage", {"stage": "warmup", "what": "cold" if not live else "top-up"})
            records, counters, cold_s = self._warmup(gen, cfg_path, overrides,
                                                     posixpath.join(work, "report-cold.json"),
                                                     save_mega=posixpath.join(gen, sn.MEGA_FILE))
            warm_s: float | None = None
            warm_counters: dict[str, int] = {}
            if measure:
                check = p.gen(stamp + "-check")
                try:
                    self.cache.run(["cp", "-a", "--", gen + "/.", check],
                                   "copying the cache for the check run")
                    self.cache.events("stage", {"stage": "check", "what": "warm-up on the saved cache"})
                    _, warm_counters, warm_s = self._warmup(check, cfg_path, overrides,
                                                            posixpath.join(work, "report-warm.json"))
                finally:
                    self.cache.rm(check)
            res = WarmResult(host=self.cache.host, key=key.key, action="warmed", records=records,
                             counters=counters, cold_s=cold_s, warm_s=warm_s,
                             warm_counters=warm_counters)
            self.cache.events("stage", {"stage": "snapshot", "what": p.tar})
            m = self._save(p, gen, key, stamp, res)
        except BaseException:
            self.cache.rm(gen)
            raise
        finally:
            self.cache.rm(work)
        self.cache.switch(p, gen, stamp)
        res.snapshot_size = m["tar"]["size"]
        res.cache_size = m["sizes"]["total"]
        res.manifest, res.tar = p.manifest, p.tar
        return res

    def adopt(self, cache_dir: str, key: ck.CacheKey, *, warmup: Mapping[str, Any] | None = None) -> dict:
        """Take an existing cache dir on the host (``inductor/``, ``triton/``, ``mega/``
        inside), made in this env for this key, as a new generation: copy it, snapshot
        it, make it live. The source dir is not changed."""
        p = sn.paths(self.cache.tree, key.key)
        stamp = self.cache.stamp()
        gen = p.gen(stamp)
        self.cache.run(["mkdir", "-p", "--", gen], "creating the cache dir")
        try:
            self.cache.run(["cp", "-a", "--", cache_dir.rstrip("/") + "/.", gen], f"copying {cache_dir}")
            w = warmup or {}
            res = WarmResult(host=self.cache.host, key=key.key, action="adopted", cold_s=w.get("cold_s"),
                             warm_s=w.get("warm_s"))
            m = self._save(p, gen, key, stamp, res)
        except BaseException:
            self.cache.rm(gen)
            raise
        self.cache.switch(p, gen, stamp)
        return m

    def _warmup(self, cache_dir: str, cfg_path: str, overrides: Sequence[tuple[str, str]],
                report: str, *, save_mega: str | None = None) -> tuple[list[WarmupShape], dict[str, int], float]:
        env = warmup_env(cache_dir)
        # one warm-up at a time per host (flock exits LOCK_CONFLICT at once when another holds it)
        lock = posixpath.join(self.cache.tree.locks, "cache.lock")
        self.cache.run(["mkdir", "-p", "--", self.cache.tree.locks], "creating the locks dir")
        argv = ["flock", "-n", "-E", str(LOCK_CONFLICT), lock,
                *warmup_argv(self.cache.python, cfg_path, overrides, report, save_mega=save_mega)]
        tail: list[str] = []

        def on_line(line: str) -> None:
            m = read_marker(line)
            if m is not None:
                self.cache.events("marker", m)      # a typed trainer marker
                return
            tail.append(line)
            del tail[:-30]
            log.debug("warmup: %s", line)
            self.cache.events("line", {"line": line})

        r = self.cache.transport.stream(argv, on_line, env=env, cwd=self.cache.tree.root,
                                timeout=self.cache.timeout)
        if r.exit_code == LOCK_CONFLICT:
            raise LockHeldError(f"another warm-up holds {lock} on {self.cache.host}",
                                hint="wait for the other `dfo warm-cache` to finish")
        if r.exit_code != 0:
            last = warmup_error_line(tail)
            msg = f"the trainer's warm-up on {self.cache.host} exited {r.exit_code}" + (f": {last}" if last else "")
            if r.exit_code == 2:
                raise ConfigError(msg, hint="fix the trainer config (see `python -m trainer warmup --help`)")
            hint = None
            if "InvalidCxxCompiler" in last or "C++ compiler" in last:
                hint = "inductor on CPU needs a C++ compiler on the host: install g++ there"
            raise RemoteCommandError(msg, hint=hint, exit_status=r.exit_code, stderr="\n".join(tail))
        return parse_report(self.cache.transport.get(report))

    def _save(self, p: sn.CachePaths, gen: str, key: ck.CacheKey, stamp: str, res: WarmResult) -> dict:
        """Snapshot ``gen``: tar under a temporary name, rename; manifest written last."""
        self.cache.run(["mkdir", "-p", "--", self.cache.tree.snapshots], "creating the snapshot store")
        for sub in ("inductor", "triton", "mega"):
            self.cache.run(["mkdir", "-p", "--", posixpath.join(gen, sub)], "creating the cache dirs")
        listing = self.cache.tool("hashdir", gen)
        sn.check_dir_members(listing.get("other") or (), f"{self.cache.host}:{gen}")
        files = listing.get("files") or {}
        tmp = p.tar_tmp(stamp)
        try:
            self.cache.run(["tar", "-cf", tmp, "-C", gen, "--", "inductor", "triton", "mega"],
                           "writing the snapshot tar")
            tar_info = self.cache.tool("hashfile", tmp)
            fp_torch = key.components.get("torch.__version__")
            now = time.time()
            prov = build_provenance(host=self.cache.host, machine=self.cache.machine,
                                    fingerprint=self.cache.fingerprint(),
                                    key=key.key, created=now, dfo=__version__)
            m = sn.build_manifest(key.key, key.components, files, tar_sha256=tar_info["sha256"],
                                  tar_size=tar_info["size"], created=now, torch=fp_torch, provenance=prov,
                                  warmup={"cold_s": res.cold_s, "warm_s": res.warm_s,
                                          "shapes": len(res.records),
                                          "counters": res.counters,
                                          "warm_counters": res.warm_counters})
        except BaseException:
            self.cache.rm(tmp)
            raise
        self.cache.store(p, tmp, m)
        return m
