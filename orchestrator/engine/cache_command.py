"""``dfo warm-cache`` as one engine call: which of status / prune / pull / push / restore /
warm to do, and in what order (restore a verified snapshot of this env's key when the
host's store has one, else warm up and say how the nearest stored snapshot differs)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from dfo_contract.cache_records import Manifest, WarmupInfo

from ..common.errors import CacheError, ConfigError
from ..plan import snapshot as sn
from ..plan.cache_key import explain_diff
from .cache_warmup import WarmResult
from .compile_cache import CacheManager


@dataclass
class WarmCacheRequest:
    """What ``dfo warm-cache`` was asked (at most one of the modes)."""

    config_path: str | None = None
    overrides: Sequence[tuple[str, str]] = ()
    from_file: str | None = None
    pull_dest: str | None = None
    key_name: str | None = None
    push_file: str | None = None
    show_status: bool = False
    prune_keep: int | None = None
    rewarm: bool = False
    check: bool = True
    trust_other_hosts: bool = False   # take a snapshot another host built (it carries code)

    def validate(self) -> None:
        modes = [m for m, on in (("--from", self.from_file), ("--pull", self.pull_dest is not None),
                                 ("--push", self.push_file), ("--status", self.show_status),
                                 ("--prune", self.prune_keep is not None)) if on]
        if len(modes) > 1:
            raise ConfigError(f"warm-cache: {' and '.join(modes)} cannot be combined; give one")
        if self.key_name is not None and self.pull_dest is None and not (self.show_status or
                                                                         self.prune_keep is not None):
            raise ConfigError("warm-cache: --key only goes with --pull (other modes use this env's key)")


@dataclass
class WarmCacheOutcome:
    """Either a result (restored / warmed / pushed / pulled) or the host's cache listing."""

    result: WarmResult | None = None
    components: Mapping[str, Any] = field(default_factory=dict)
    entries: list[sn.CacheEntry] | None = None
    removed: list[str] | None = None


def restored_result(host: str, key: str, action: str, source: str, m: Manifest) -> WarmResult:
    w = m.warmup or WarmupInfo()
    return WarmResult(host=host, key=key, action=action, source=source,
                      cold_s=w.cold_s, warm_s=w.warm_s,
                      counters=dict(w.counters), warm_counters=dict(w.warm_counters),
                      snapshot_size=m.tar.size, cache_size=m.sizes.total)


def _pulled(host: str, key: str, tar: Path, man: Path) -> WarmResult:
    return WarmResult(host=host, key=key, action="pulled", tar=str(tar), manifest=str(man),
                      snapshot_size=tar.stat().st_size)


def warm_cache(mgr: CacheManager, req: WarmCacheRequest,
               stage: Callable[[str, str], None] = lambda name, what: None) -> WarmCacheOutcome:
    """Carry out one ``dfo warm-cache`` on ``mgr``'s host."""
    req.validate()
    t0 = time.monotonic()
    host = mgr.host
    if req.show_status or req.prune_keep is not None:
        removed = mgr.prune(req.prune_keep) if req.prune_keep is not None else None
        entries, _ = mgr.status(verify=req.show_status)
        return WarmCacheOutcome(entries=entries, removed=removed)
    if req.key_name is not None:
        tar, man = mgr.pull(req.key_name, Path(req.pull_dest or "."))
        return _done(_pulled(host, req.key_name, tar, man), {}, t0)

    overrides = list(req.overrides)
    moving = req.pull_dest is not None or req.push_file or req.from_file
    if moving and req.config_path is None and not overrides:
        # --pull / --from / --push need no config: the key comes from the store or the
        # snapshot's manifest (its env components re-checked against this host)
        stage("key", f"finding the snapshot's key on {host}")
        key = _key_without_config(mgr, req)
        cfg_bytes = b""
    else:
        from ..config.runconfig import load_run_layers

        layers = load_run_layers(req.config_path, mgr.tree, overrides)
        cfg_bytes = layers.data
        comp = layers.config.compile
        if not (comp.enabled or comp.target) and not moving:
            which = f"--config {req.config_path}" if req.config_path else \
                "the default config (the demo's)"
            raise ConfigError(f"warm-cache: nothing to warm: {which} has compile.enabled false",
                              hint="pass the --config you launch with, or --set "
                                   "compile.enabled=true (and launch with it too)")
        stage("key", f"computing the cache key on {host}")
        key = mgr.key(layers.config, source=req.config_path)
    if req.pull_dest is not None:
        tar, man = mgr.pull(key.key, Path(req.pull_dest))
        return _done(_pulled(host, key.key, tar, man), key.components, t0)
    src = req.push_file or req.from_file
    if src:
        m = mgr.push(Path(src), key, trust_other_hosts=req.trust_other_hosts)
        res = restored_result(host, key.key, "pushed" if req.push_file else "restored", str(src), m)
        return _done(res, key.components, t0)
    p = sn.paths(mgr.tree, key.key)
    dropped = mgr.scrub_live(key.key)
    if dropped:
        stage("scrub", f"dropped {len(dropped)} file(s) of the live cache that cannot be "
                       f"loaded: " + ", ".join(f"{r} ({w})" for r, w in dropped[:3]))
    plan = sn.plan_warm(from_file=False, store_has_key=mgr.read_manifest_remote(p) is not None,
                        rewarm=req.rewarm)
    if plan.action == "restore":
        stage("restore", plan.reason)
        m = mgr.restore_from_store(key, trust_other_hosts=req.trust_other_hosts)
        return _done(restored_result(host, key.key, "restored", f"{host}:{p.tar}", m),
                     key.components, t0)
    stage("warmup", plan.reason)
    near = mgr.nearest_snapshot(key) if not req.rewarm else None
    res = mgr.warm(key, cfg_bytes, overrides, measure=req.check)
    if near:
        res.source = None
        res.note = f"nearest other snapshot {near[0]} differs in: {explain_diff(near[1])}"
    return _done(res, key.components, t0)


def _key_without_config(mgr: CacheManager, req: WarmCacheRequest):
    from ..common.errors import NotFoundError
    from ..plan import cache_key as ck
    from .compile_cache import local_snapshot_files

    if req.pull_dest is not None:
        entries, _ = mgr.status()
        snaps = [e.key for e in entries if e.snapshot_size is not None]
        if len(snaps) == 1:
            return ck.CacheKey(key=snaps[0], components={})
        if not snaps:
            raise NotFoundError(f"no compile-cache snapshots on {mgr.host}",
                                hint="warm one with `dfo warm-cache --config F`")
        raise ConfigError(f"warm-cache --pull: {len(snaps)} snapshots on {mgr.host}: "
                          + ", ".join(snaps), hint="name one with --key K, or pass --config F")
    src = req.push_file or req.from_file
    assert src, "called for --pull, --push or --from only"
    tar, man = local_snapshot_files(Path(src))
    m = sn.parse_manifest(man.read_bytes(), str(man))
    fp = mgr.fingerprint()
    comps = dict(m.components)
    comps.update(ck.fingerprint_components(fp))
    comps["trainer.source"] = mgr.trainer_source()
    comps = dict(sorted(comps.items()))
    return ck.CacheKey(key=ck.key_of(comps, profile=fp.profile or "env"),
                       components=comps)


def status_problems(host: str, entries: Sequence[sn.CacheEntry]) -> CacheError | None:
    """``--status`` found stored snapshots that fail verification, or live caches holding
    files that cannot be loaded: one line naming them."""
    bad = [e for e in entries if e.problem]
    damaged = [e for e in entries if e.live_problem]
    if not bad and damaged:
        first = f"{damaged[0].key}: {damaged[0].live_problem}"
        more = f" (+{len(damaged) - 1} more)" if len(damaged) > 1 else ""
        return CacheError(f"{len(damaged)} live compile cache(s) on {host} are damaged: "
                          f"{first}{more}",
                          hint="`dfo warm-cache` (with the config you launch with) drops them "
                               "and restores or warms the key again")
    if not bad:
        return None
    first = f"{bad[0].key}: {bad[0].problem}"
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return CacheError(f"{len(bad)} stored snapshot(s) on {host} fail verification: {first}{more}",
                      hint="take it again with `dfo warm-cache --rewarm`, or push a good copy with --push")


def _done(res: WarmResult, components: Mapping[str, Any], t0: float) -> WarmCacheOutcome:
    res.seconds = round(time.monotonic() - t0, 3)
    return WarmCacheOutcome(result=res, components=components)
