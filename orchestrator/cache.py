"""``dfo warm-cache``: the compile cache as a managed artifact (execution).

Decisions (key, manifest checks, plans) are pure, in ``orchestrator.ops.cache_key`` and
``orchestrator.ops.snapshot``; this module carries them out through a ``Transport``.
Every remote command is an argv list: ``tar``, ``mv``, ``ln``, ``rm``, ``mkdir`` and the
env's python running a constant script (``CACHE_TOOL``/``SOURCE_HASH_SCRIPT``) with the
values as argv elements.

Nothing half-made is ever live: a warm-up or a restore builds a new generation
directory ``cache/.gens/<key>-<gen>`` and only then switches the ``cache/<key>``
symlink to it with one rename; a snapshot's tar is written under a temporary name and
renamed, and its manifest is written last.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .errors import CacheError, ConfigError, DeployError, DfoError, LockHeldError, NotFoundError, \
    RemoteCommandError
from .ops import cache_key as ck
from .ops import snapshot as sn
from .ops.layout import RemoteLayout
from .transport.base import Transport

log = logging.getLogger("dfo")

MARK = "@dfo "
#: how the env's python runs the trainer's warm-up (docs/contracts.md)
WARMUP_ARGS: tuple[str, ...] = ("-m", "trainer", "warmup")
#: flock's exit status when the host's cache lock is held (not one the trainer uses)
LOCK_CONFLICT = 75
Event = Callable[[str, Mapping[str, Any]], None]


def _noop(kind: str, data: Mapping[str, Any]) -> None:
    pass


# --------------------------------------------------------------------------- trainer config

def load_config(path: str | os.PathLike | None, overrides: Sequence[tuple[str, str]] = ()) -> tuple[dict, bytes]:
    """The trainer config as a nested dict (defaults + file + overrides, validated by
    ``trainer.config``, which imports no torch) and the file's bytes to ship.
    ``path`` None means the built-in defaults."""
    text = b""
    if path is not None:
        try:
            text = Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"--config {path}: cannot read: {e.strerror or e}") from None
    from dfo_contract import trainer_config as tcfg

    try:
        cfg = tcfg.load_config(str(path) if path is not None else None, list(overrides))
    except DfoError:
        raise
    except Exception as e:  # noqa: BLE001 - any trainer-side validation failure: one line
        line = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        raise ConfigError(line if line.startswith("config:") else f"trainer config: {line}") from None
    return cfg.to_dict(), text


# --------------------------------------------------------------------------- results

@dataclass
class WarmResult:
    """What one ``dfo warm-cache`` did, for the table and ``--json``."""

    host: str
    key: str
    action: str                       # "restored" | "warmed" | "pushed" | "pulled"
    source: str | None = None         # where a restored snapshot came from
    records: list[dict] = field(default_factory=list)     # per device+shape: seconds, counters
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
        d["saved_s"] = self.saved_s
        return d


def parse_report(data: bytes | str) -> tuple[list[dict], dict[str, int], float]:
    """The trainer's warm-up report -> (records, counter totals, total seconds).
    Records are ``{device, shape, what, seconds, counters}`` (trainer.gate.WarmupRecord)."""
    try:
        rep = json.loads(data)
    except ValueError:
        raise CacheError("the trainer's warm-up report is not JSON",
                         hint="check the trainer version in the env (`dfo deploy --check`)") from None
    recs = None
    if isinstance(rep, list):
        recs = rep
    elif isinstance(rep, dict):
        for k in ("records", "shapes", "warmup"):
            if isinstance(rep.get(k), list):
                recs = rep[k]
                break
    if recs is None:
        raise CacheError("the trainer's warm-up report has no records")
    records = []
    totals: dict[str, int] = {}
    for r in recs:
        if not isinstance(r, dict):
            continue
        c = {k: int(v) for k, v in (r.get("counters") or {}).items() if isinstance(v, (int, float))}
        for k, v in c.items():
            totals[k] = totals.get(k, 0) + v
        records.append({"device": str(r.get("device", "?")), "shape": list(r.get("shape") or []),
                        "what": str(r.get("what", "")), "seconds": float(r.get("seconds") or 0.0),
                        "counters": c})
    if isinstance(rep, dict) and isinstance(rep.get("totals"), dict):  # process totals
        totals = {k: int(v) for k, v in rep["totals"].items() if isinstance(v, (int, float))}
    total_s = sum(r["seconds"] for r in records)
    if isinstance(rep, dict) and isinstance(rep.get("seconds"), (int, float)):
        total_s = float(rep["seconds"])  # the whole warm-up, model building included
    return records, totals, round(total_s, 3)


# --------------------------------------------------------------------------- the manager

class CacheManager:
    """Compile-cache operations on one host (through its transport)."""

    def __init__(self, transport: Transport, layout: RemoteLayout, *, host: str | None = None,
                 events: Event = _noop, timeout: float | None = None):
        self.t = transport
        self.layout = layout
        self.host = host or transport.name
        self.events = events
        self.timeout = timeout

    # -- small remote helpers ----------------------------------------------------------------
    @property
    def python(self) -> str:
        return self.layout.current_python

    def _run(self, argv: Sequence[str], what: str, **kw) -> str:
        return self.t.run(list(argv), check=False, timeout=self.timeout, **kw).check(what).out

    def _tool(self, op: str, *args: str) -> dict[str, Any]:
        r = self.t.run(sn.tool_argv(self.python, op, *args), timeout=self.timeout)
        if not r.ok:
            r.check(f"cache helper {op}")
        return sn.parse_tool(r.out, f"cache helper {op}")

    def _exists_dir(self, path: str) -> bool:
        return self.t.run(["test", "-d", path], timeout=self.timeout).ok

    def _exists_file(self, path: str) -> bool:
        return self.t.run(["test", "-f", path], timeout=self.timeout).ok

    def _rm(self, *paths: str) -> None:
        if paths:
            self.t.run(["rm", "-rf", "--", *paths], timeout=self.timeout)

    def _stamp(self) -> str:
        return f"{int(time.time())}-{secrets.token_hex(3)}"

    # -- the key -----------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        path = posixpath.join(self.layout.current_env, "fingerprint.json")
        try:
            data = self.t.get(path)
        except (NotFoundError, RemoteCommandError):
            raise DeployError(f"no deployed env on {self.host} ({path} missing)",
                              hint="run `dfo deploy` first") from None
        try:
            fp = json.loads(data)
            assert isinstance(fp, dict)
        except (ValueError, AssertionError):
            raise DeployError(f"{path} on {self.host} is not valid JSON",
                              hint="redeploy with `dfo deploy`") from None
        return fp

    def trainer_source(self) -> str:
        probe = ck.source_hash_probe(self.python, timeout=self.timeout)
        r = self.t.run(list(probe.argv), timeout=probe.timeout)
        if r.exit_code not in (0, 3):  # 3: a package is missing (parse says None)
            r.check("hashing the trainer source")
        combined = probe.parse(r)
        if combined is None:
            raise CacheError(f"the env on {self.host} has no trainer or dfo_contract package "
                             f"(or an older dfo wheel)", hint="redeploy with `dfo deploy`")
        return combined

    def target_config_hash(self, config: Mapping[str, Any]) -> str | None:
        target = (config.get("model") or {}).get("target_path")
        if not target:
            return None
        r = self._tool("hashfile", posixpath.join(str(target), "config.json"))
        return None if r.get("missing") else r["sha256"]

    def key(self, config: Mapping[str, Any]) -> ck.CacheKey:
        return ck.compute_key(self.fingerprint(), config, trainer_source=self.trainer_source(),
                              target_config=self.target_config_hash(config))

    # -- live cache --------------------------------------------------------------------------
    def _live_target(self, p: sn.CachePaths) -> str | None:
        r = self.t.run(["readlink", "-f", "--", p.live], timeout=self.timeout)
        if not r.ok or not self._exists_dir(p.live):
            return None
        return r.out.strip() or None

    def _switch(self, p: sn.CachePaths, gen: str, stamp: str) -> None:
        """Make ``gen`` the live cache of the key: one rename of a symlink."""
        old = self._live_target(p)
        if old is None and self._exists_dir(p.live):  # a plain directory from elsewhere
            old = p.live + f".old-{stamp}"
            self._run(["mv", "-T", "--", p.live, old], "moving the old cache aside")
        tmp = p.link_tmp(stamp)
        self._run(["ln", "-sfn", "--", gen, tmp], "linking the new cache")
        self._run(["mv", "-Tf", "--", tmp, p.live], "switching the live cache")
        if old and old != gen:
            self._rm(old)
        self.touch_used(p)

    def touch_used(self, p: sn.CachePaths) -> None:
        self.t.run(["mkdir", "-p", "--", posixpath.dirname(p.used)], timeout=self.timeout)
        self.t.run(["touch", "--", p.used], timeout=self.timeout)

    # -- restore -----------------------------------------------------------------------------
    def read_manifest_remote(self, p: sn.CachePaths) -> dict[str, Any] | None:
        if not self._exists_file(p.manifest):
            return None
        return sn.parse_manifest(self.t.get(p.manifest), f"{self.host}:{p.manifest}")

    def restore_from_store(self, key: ck.CacheKey) -> dict[str, Any]:
        """Verify the host store's snapshot for ``key`` and make it the live cache."""
        p = sn.paths(self.layout, key.key)
        m = self.read_manifest_remote(p)
        if m is None:
            raise NotFoundError(f"no snapshot for key {key.key} on {self.host}",
                                hint="warm one with `dfo warm-cache`")
        self._restore(p, m, p.tar, key, f"{self.host}:{p.tar}")
        return m

    def _restore(self, p: sn.CachePaths, m: Mapping[str, Any], tar: str, key: ck.CacheKey,
                 source: str) -> None:
        sn.check_key(m, key.key, key.components, source)
        self.events("stage", {"stage": "verify", "what": source})
        sn.check_tar(m, self._tool("hashfile", tar), source)
        stamp = self._stamp()
        gen = p.gen(stamp)
        self.events("stage", {"stage": "unpack", "what": gen})
        try:
            self._run(["mkdir", "-p", "--", gen], "creating the cache dir")
            self._run(["tar", "-xf", tar, "-C", gen, "--no-same-owner"], f"unpacking {source}")
            got = self._tool("hashdir", gen)
            sn.check_files(m, got.get("files") or {}, source)
        except BaseException:
            self._rm(gen)
            raise
        self._switch(p, gen, stamp)

    def push(self, local_tar: Path, key: ck.CacheKey, *, restore: bool = True) -> dict[str, Any]:
        """Verify a local snapshot (manifest beside it), upload it into the host's store
        (temporary name, then rename; manifest last) and restore it."""
        local_tar, local_manifest = local_snapshot_files(local_tar)
        source = str(local_tar)
        m = sn.parse_manifest(local_manifest.read_bytes(), str(local_manifest))
        sn.check_key(m, key.key, key.components, source)
        sn.check_tar(m, _hash_local(local_tar), source)
        p = sn.paths(self.layout, key.key)
        stamp = self._stamp()
        tmp = p.tar_tmp(stamp)
        self.events("stage", {"stage": "upload", "what": source, "bytes": local_tar.stat().st_size})
        self._run(["mkdir", "-p", "--", self.layout.snapshots], "creating the snapshot store")
        try:
            self.t.put(local_tar, tmp, mode=0o644)
            if restore:
                self._restore(p, m, tmp, key, source)
            # into the store: the old manifest goes first, the new one comes last
            self._rm(p.manifest)
            self._run(["mv", "-f", "--", tmp, p.tar], "storing the snapshot")
        except BaseException:
            self._rm(tmp)
            raise
        self.t.put(sn.manifest_bytes(m), p.manifest, mode=0o644)
        return m

    def pull(self, key: str, dest: Path) -> tuple[Path, Path]:
        """Copy the host's snapshot for ``key`` (verified) to ``dest`` (a dir or a .tar path)."""
        p = sn.paths(self.layout, key)
        m = self.read_manifest_remote(p)
        if m is None:
            raise NotFoundError(f"no snapshot for key {key} on {self.host}",
                                hint="warm one first with `dfo warm-cache`")
        dest = Path(dest)
        if dest.is_dir() or str(dest).endswith(os.sep) or not dest.name.endswith(".tar"):
            dest.mkdir(parents=True, exist_ok=True)
            tar_path = dest / f"{key}.tar"
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tar_path = dest
        man_path = tar_path.with_name(tar_path.name[: -len(".tar")] + ".manifest.json")
        self.events("stage", {"stage": "download", "what": f"{self.host}:{p.tar}"})
        part = tar_path.with_name(f".{tar_path.name}.dfo-pull")
        try:
            self.t.get_file(p.tar, part)
            sn.check_tar(m, _hash_local(part), f"{self.host}:{p.tar}")
            part.replace(tar_path)  # only a verified tar takes the name
        finally:
            part.unlink(missing_ok=True)
        tmp = man_path.with_name(f".{man_path.name}.dfo-tmp")
        tmp.write_bytes(sn.manifest_bytes(m))
        tmp.replace(man_path)
        return tar_path, man_path

    # -- warm --------------------------------------------------------------------------------
    def warm(self, key: ck.CacheKey, config_bytes: bytes, overrides: Sequence[tuple[str, str]],
             *, measure: bool = True, fresh: bool = False) -> WarmResult:
        """Run the trainer's warm-up into a new generation of the key's cache (seeded from
        the live one unless ``fresh``), switch it live, then (``measure``) run the warm-up
        again on a throwaway copy to record the warm figures, and save a snapshot."""
        p = sn.paths(self.layout, key.key)
        stamp = self._stamp()
        gen = p.gen(stamp)
        work = posixpath.join(self.layout.cache, ".work", f"{key.key}-{stamp}")
        cfg_path = posixpath.join(work, "config.yaml")
        self._run(["mkdir", "-p", "--", work, posixpath.join(gen, "mega")], "creating the cache dirs")
        try:
            # no file: the trainer's defaults plus the overrides (an empty YAML mapping)
            self.t.put(config_bytes or b"{}\n", cfg_path, mode=0o644)
            live = None if fresh else self._live_target(p)
            if live:
                self._run(["cp", "-a", "--", live + "/.", gen], "copying the live cache")
            self.events("stage", {"stage": "warmup", "what": "cold" if not live else "top-up"})
            records, counters, cold_s = self._warmup(gen, cfg_path, overrides,
                                                     posixpath.join(work, "report-cold.json"),
                                                     save_mega=posixpath.join(gen, sn.MEGA_FILE))
            warm_s, warm_counters = None, {}
            if measure:
                check = p.gen(stamp + "-check")
                try:
                    self._run(["cp", "-a", "--", gen + "/.", check], "copying the cache for the check run")
                    self.events("stage", {"stage": "check", "what": "warm-up on the saved cache"})
                    _, warm_counters, warm_s = self._warmup(check, cfg_path, overrides,
                                                            posixpath.join(work, "report-warm.json"))
                finally:
                    self._rm(check)
            res = WarmResult(host=self.host, key=key.key, action="warmed", records=records,
                             counters=counters, cold_s=cold_s, warm_s=warm_s,
                             warm_counters=warm_counters)
            self.events("stage", {"stage": "snapshot", "what": p.tar})
            m = self._save(p, gen, key, stamp, res)
        except BaseException:
            self._rm(gen)
            raise
        finally:
            self._rm(work)
        self._switch(p, gen, stamp)
        res.snapshot_size = m["tar"]["size"]
        res.cache_size = m["sizes"]["total"]
        res.manifest, res.tar = p.manifest, p.tar
        return res

    def adopt(self, cache_dir: str, key: ck.CacheKey, *, warmup: Mapping[str, Any] | None = None) -> dict:
        """Take an existing cache dir on the host (``inductor/``, ``triton/``, ``mega/``
        inside), made in this env for this key, as a new generation: copy it, snapshot
        it, make it live. The source dir is not changed."""
        p = sn.paths(self.layout, key.key)
        stamp = self._stamp()
        gen = p.gen(stamp)
        self._run(["mkdir", "-p", "--", gen], "creating the cache dir")
        try:
            self._run(["cp", "-a", "--", cache_dir.rstrip("/") + "/.", gen], f"copying {cache_dir}")
            w = warmup or {}
            res = WarmResult(host=self.host, key=key.key, action="adopted", cold_s=w.get("cold_s"),
                             warm_s=w.get("warm_s"))
            m = self._save(p, gen, key, stamp, res)
        except BaseException:
            self._rm(gen)
            raise
        self._switch(p, gen, stamp)
        return m

    def _warmup(self, cache_dir: str, cfg_path: str, overrides: Sequence[tuple[str, str]],
                report: str, *, save_mega: str | None = None) -> tuple[list[dict], dict[str, int], float]:
        env = warmup_env(cache_dir)
        # one warm-up at a time per host (flock exits LOCK_CONFLICT at once when another holds it)
        lock = posixpath.join(self.layout.locks, "cache.lock")
        self._run(["mkdir", "-p", "--", self.layout.locks], "creating the locks dir")
        argv = ["flock", "-n", "-E", str(LOCK_CONFLICT), lock,
                *warmup_argv(self.python, cfg_path, overrides, report, save_mega=save_mega)]
        tail: list[str] = []

        def on_line(line: str) -> None:
            if line.startswith(MARK):
                try:
                    ev = json.loads(line[len(MARK):])
                except ValueError:
                    ev = None
                if isinstance(ev, dict):
                    self.events(str(ev.get("kind", "event")), ev)
                    return
            tail.append(line)
            del tail[:-30]
            log.debug("warmup: %s", line)
            self.events("line", {"line": line})

        r = self.t.stream(argv, on_line, env=env, cwd=self.layout.root, timeout=self.timeout)
        if r.exit_code == LOCK_CONFLICT:
            raise LockHeldError(f"another warm-up holds {lock} on {self.host}",
                                hint="wait for the other `dfo warm-cache` to finish")
        if r.exit_code != 0:
            last = warmup_error_line(tail)
            msg = f"the trainer's warm-up on {self.host} exited {r.exit_code}" + (f": {last}" if last else "")
            if r.exit_code == 2:
                raise ConfigError(msg, hint="fix the trainer config (see `python -m trainer warmup --help`)")
            hint = None
            if "InvalidCxxCompiler" in last or "C++ compiler" in last:
                hint = "inductor on CPU needs a C++ compiler on the host: install g++ there"
            raise RemoteCommandError(msg, hint=hint, exit_status=r.exit_code, stderr="\n".join(tail))
        return parse_report(self.t.get(report))

    def _save(self, p: sn.CachePaths, gen: str, key: ck.CacheKey, stamp: str, res: WarmResult) -> dict:
        """Snapshot ``gen``: tar under a temporary name, rename; manifest written last."""
        self._run(["mkdir", "-p", "--", self.layout.snapshots], "creating the snapshot store")
        for sub in ("inductor", "triton", "mega"):
            self._run(["mkdir", "-p", "--", posixpath.join(gen, sub)], "creating the cache dirs")
        files = self._tool("hashdir", gen).get("files") or {}
        tmp = p.tar_tmp(stamp)
        try:
            self._run(["tar", "-cf", tmp, "-C", gen, "--", "inductor", "triton", "mega"],
                      "writing the snapshot tar")
            tar_info = self._tool("hashfile", tmp)
            fp_torch = key.components.get("torch.__version__")
            m = sn.build_manifest(key.key, key.components, files, tar_sha256=tar_info["sha256"],
                                  tar_size=tar_info["size"], created=time.time(), torch=fp_torch,
                                  warmup={"cold_s": res.cold_s, "warm_s": res.warm_s,
                                          "shapes": len(res.records),
                                          "counters": res.counters,
                                          "warm_counters": res.warm_counters})
            self._rm(p.manifest)
            self._run(["mv", "-f", "--", tmp, p.tar], "storing the snapshot")
        except BaseException:
            self._rm(tmp)
            raise
        self.t.put(sn.manifest_bytes(m), p.manifest, mode=0o644)
        return m

    def nearest_snapshot(self, key: ck.CacheKey) -> tuple[str, list[tuple[str, str, str]]] | None:
        """The stored snapshot whose components differ least from ``key``'s, and how
        (to explain why a start is cold, e.g. ``torch.version.cuda: snapshot 12.8, env 13.0``)."""
        _, raw = self.status()
        best = None
        for other in sorted(raw.get("snapshots") or {}):
            if other == key.key:
                continue
            try:
                m = sn.parse_manifest(self.t.get(sn.paths(self.layout, other).manifest), other)
            except DfoError:
                continue
            diffs = ck.diff_components(m["components"], key.components)
            if best is None or len(diffs) < len(best[1]):
                best = (other, diffs)
        return best

    # -- status / prune ------------------------------------------------------------------------
    def status(self) -> tuple[list[sn.Entry], dict[str, Any]]:
        python = self.python if self._exists_file(self.python) else "python3"
        r = self.t.run(sn.tool_argv(python, "status", self.layout.cache), timeout=self.timeout)
        r.check("cache status")
        raw = sn.parse_tool(r.out, "cache status")
        return sn.entries_from_status(raw), raw

    def prune(self, keep: int) -> list[str]:
        entries, raw = self.status()
        doomed = sn.plan_prune(entries, keep)
        for key in doomed:
            p = sn.paths(self.layout, key)
            target = (raw.get("live") or {}).get(key, {}).get("target")
            # the manifest first: from then on the snapshot does not exist
            self._rm(p.manifest)
            self._rm(p.tar, p.live, p.used, *([target] if target else []))
        # leftovers of interrupted warm-ups/restores (never live)
        stale = [posixpath.join(self.layout.cache, s) for s in raw.get("stale") or []]
        self._rm(*stale)
        return doomed


# --------------------------------------------------------------------------- pure-ish helpers

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


def _hash_local(path: Path) -> dict[str, Any]:
    import hashlib

    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            n += len(chunk)
    return {"sha256": h.hexdigest(), "size": n}
