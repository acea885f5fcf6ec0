"""Unit tests for snapshot manifests, verification and plans (orchestrator.plan.snapshot).

The cache helper script (CACHE_TOOL) is run for real with this interpreter on temp dirs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dfo_contract.cache_records import (CacheSizes, CacheStatusReply, FileDigest, HashDirReply,
                                        HashFileReply, TarRef, WarmupInfo)
from orchestrator.common.errors import CacheError
from orchestrator.plan import snapshot as sn
from orchestrator.config.host_tree import HostTree

H = hashlib.sha256(b"x").hexdigest()
FILES = {"inductor/fxgraph/ab/c": FileDigest(sha256=H, size=10),
         "inductor/aotautograd/x/y": FileDigest(sha256=H, size=5),
         "mega/artifacts.bin": FileDigest(sha256=H, size=7)}
COMPS = {"torch.__version__": "2.13.0+cpu", "torch.version.cuda": "12.8", "gpu": "cpu"}


def manifest():
    return sn.build_manifest("cpu-0123456789abcdef", COMPS, FILES, tar_sha256=H, tar_size=100,
                             created=1700000000.0, torch="2.13.0+cpu",
                             warmup=WarmupInfo(cold_s=3.0))


def test_manifest_round_trip_and_sizes():
    m = manifest()
    back = sn.parse_manifest(sn.manifest_bytes(m), "m")
    assert back == m
    assert m.sizes == CacheSizes(inductor=15, triton=0, mega=7, total=22)
    assert m.tar == TarRef(name="cpu-0123456789abcdef.tar", sha256=H, size=100)


@pytest.mark.parametrize("mutate,needle", [
    (lambda m: m.update(format=2), "format 2"),
    (lambda m: m.pop("key"), "'key'"),
    (lambda m: m.update(key="../evil"), "'key'"),
    (lambda m: m.update(components={"a": 1}), "components"),
    (lambda m: m["files"].update({"../etc/passwd": {"sha256": H, "size": 1}}), "../etc/passwd"),
    (lambda m: m["files"].update({"/abs/x": {"sha256": H, "size": 1}}), "/abs/x"),
    (lambda m: m["files"].update({"other/x": {"sha256": H, "size": 1}}), "other/x"),
    (lambda m: m["files"].update({"inductor/x": {"sha256": "zz", "size": 1}}), "inductor/x"),
    (lambda m: m.update(tar={"sha256": H}), "'tar'"),
])
def test_parse_manifest_refuses_bad_manifests(mutate, needle):
    m = json.loads(sn.manifest_bytes(manifest()))
    mutate(m)
    with pytest.raises(CacheError) as e:
        sn.parse_manifest(json.dumps(m), "snap.manifest.json")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_parse_manifest_refuses_truncated_json():
    data = sn.manifest_bytes(manifest())
    with pytest.raises(CacheError, match="not JSON"):
        sn.parse_manifest(data[: len(data) // 2], "m")


def test_check_key_names_each_differing_component():
    m = manifest()
    env = dict(COMPS, **{"torch.version.cuda": "13.0", "gpu": "cuda:0=NVIDIA H200 (9.0)"})
    with pytest.raises(CacheError) as e:
        sn.check_key(m, "cpu-ffffffffffffffff", env, "snap.tar")
    msg = str(e.value)
    assert "torch.version.cuda: snapshot 12.8, env 13.0" in msg
    assert "gpu: snapshot cpu, env cuda:0=NVIDIA H200 (9.0)" in msg
    assert e.value.exit_code == 8
    sn.check_key(m, m.key, COMPS, "snap.tar")  # same env: accepted


def test_check_tar_detects_truncation_and_corruption():
    m = manifest()
    sn.check_tar(m, FileDigest(sha256=H, size=100), "s")
    with pytest.raises(CacheError, match="truncated"):
        sn.check_tar(m, FileDigest(sha256=H, size=50), "s")
    with pytest.raises(CacheError, match="corrupt"):
        sn.check_tar(m, FileDigest(sha256="0" * 64, size=100), "s")
    with pytest.raises(CacheError, match="missing"):
        sn.check_tar(m, HashFileReply(missing=True).digest, "s")


def test_file_problems_lists_missing_extra_and_changed():
    obs = dict(FILES)
    obs.pop("mega/artifacts.bin")
    obs["inductor/new"] = FileDigest(sha256=H, size=1)
    obs["inductor/fxgraph/ab/c"] = FileDigest(sha256=H, size=11)
    obs["inductor/aotautograd/x/y"] = FileDigest(sha256="0" * 64, size=5)
    probs = sn.file_problems(FILES, obs)
    assert probs == ["inductor/aotautograd/x/y: sha256 differs",
                     "inductor/fxgraph/ab/c: 11 bytes, manifest says 10",
                     "inductor/new: not in the manifest", "mega/artifacts.bin: missing"]
    with pytest.raises(CacheError, match="fails its checksums"):
        sn.check_files(manifest(), obs, "s")
    sn.check_files(manifest(), FILES, "s")


def test_plan_warm():
    assert sn.plan_warm(from_file=True, store_has_key=True).source == "file"
    assert sn.plan_warm(from_file=False, store_has_key=True) == sn.WarmPlan(
        "restore", "store", sn.plan_warm(from_file=False, store_has_key=True).reason)
    assert sn.plan_warm(from_file=False, store_has_key=False).action == "warm"
    assert sn.plan_warm(from_file=False, store_has_key=True, rewarm=True).action == "warm"


def test_plan_prune_keeps_the_newest_by_last_use():
    es = [sn.CacheEntry("a", created=1.0, last_used=50.0), sn.CacheEntry("b", created=10.0),
          sn.CacheEntry("c", created=5.0, last_used=None), sn.CacheEntry("d", created=2.0, last_used=40.0)]
    assert sn.plan_prune(es, 2) == ["b", "c"]
    assert sn.plan_prune(es, 0) == ["a", "d", "b", "c"]
    assert sn.plan_prune(es, 10) == []
    with pytest.raises(CacheError):
        sn.plan_prune(es, -1)


def test_paths_and_cache_env_are_per_run_copies():
    tree = HostTree("/r")
    p = sn.paths(tree, "cpu-0123")
    assert p.live == "/r/cache/cpu-0123"
    assert p.tar == "/r/cache/snapshots/cpu-0123.tar"
    assert p.manifest == "/r/cache/snapshots/cpu-0123.manifest.json"
    env = sn.cache_env(tree, "cpu-0123", "/r/runs/r1")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/r/runs/r1/cache/inductor"
    assert env["TRITON_CACHE_DIR"] == "/r/runs/r1/cache/triton"
    assert not env["TORCHINDUCTOR_CACHE_DIR"].startswith(p.live)
    for bad in ("../x", ".hidden", "a/b", ""):
        with pytest.raises(CacheError):
            sn.paths(tree, bad)


def _run_tool(*args, reply):
    r = subprocess.run(sn.tool_argv(sys.executable, *args), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return sn.parse_tool(r.stdout, "t", reply)


def test_tool_hashdir_and_hashfile(tmp_path: Path):
    (tmp_path / "inductor" / "a").mkdir(parents=True)
    (tmp_path / "inductor" / "a" / "f").write_bytes(b"hello")
    (tmp_path / "triton").mkdir()
    os.symlink("/etc/passwd", tmp_path / "triton" / "link")
    got = _run_tool("hashdir", str(tmp_path), reply=HashDirReply)
    assert got.files == {"inductor/a/f": FileDigest(sha256=hashlib.sha256(b"hello").hexdigest(),
                                                    size=5)}
    assert got.other == ["triton/link"]
    assert _run_tool("hashfile", str(tmp_path / "inductor/a/f"), reply=HashFileReply).size == 5
    assert _run_tool("hashfile", str(tmp_path / "nope"),
                     reply=HashFileReply) == HashFileReply(missing=True)
    assert _run_tool("hashdir", str(tmp_path / "nope"),
                     reply=HashDirReply) == HashDirReply(missing=True)


def test_tool_status_and_entries(tmp_path: Path):
    cache = tmp_path / "cache"
    gen = cache / ".gens" / "k1-1"
    (gen / "inductor").mkdir(parents=True)
    (gen / "inductor" / "f").write_bytes(b"x" * 100)
    os.symlink(gen, cache / "k1")
    (cache / ".gens" / "k2-dead").mkdir()
    (cache / "snapshots").mkdir()
    (cache / "snapshots" / "k1.tar").write_bytes(b"t" * 30)
    (cache / "snapshots" / "k1.manifest.json").write_text(json.dumps({"created": 5.0, "sizes": {"total": 100}}))
    (cache / "snapshots" / "k3.manifest.json").write_text(json.dumps({"created": 7.0}))
    (cache / "snapshots" / ".k4.tar.tmp-1").write_bytes(b"")
    (cache / ".used").mkdir()
    (cache / ".used" / "k1").touch()
    os.utime(cache / ".used" / "k1", (time.time(), 1000.0))
    raw = _run_tool("status", str(cache), reply=CacheStatusReply)
    assert raw.live["k1"].size == 100 and raw.live["k1"].link is True
    assert raw.snapshots["k1"].tar_size == 30
    assert raw.snapshots["k3"].tar_size is None
    assert sorted(raw.stale) == [".gens/k2-dead", "snapshots/.k4.tar.tmp-1"]
    entries = {e.key: e for e in sn.entries_from_status(raw)}
    assert entries["k1"].last_used == 1000.0 and entries["k1"].live_size == 100
    assert entries["k3"].live_size is None and entries["k3"].created == 7.0
    assert _run_tool("status", str(tmp_path / "none"), reply=CacheStatusReply) == CacheStatusReply()


def test_seed_run_cache_copies_and_never_links(tmp_path: Path):
    tree = HostTree(str(tmp_path))
    gen = tmp_path / "cache" / ".gens" / "k-1"
    (gen / "inductor").mkdir(parents=True)
    (gen / "inductor" / "f").write_bytes(b"orig")
    os.symlink(gen, tmp_path / "cache" / "k")
    run = tmp_path / "runs" / "r1"
    for argv in sn.seed_run_cache_argvs(tree, "k", str(run)):
        subprocess.run(argv, check=True)
    f = run / "cache" / "inductor" / "f"
    assert f.read_bytes() == b"orig"
    assert os.stat(f).st_ino != os.stat(gen / "inductor" / "f").st_ino
    f.write_bytes(b"changed by the run")
    assert (gen / "inductor" / "f").read_bytes() == b"orig"
    assert (tmp_path / "cache" / ".used" / "k").exists()
    # a key with no live cache: the run starts with empty dirs
    run2 = tmp_path / "runs" / "r2"
    for argv in sn.seed_run_cache_argvs(tree, "other", str(run2)):
        subprocess.run(argv, check=True)
    assert (run2 / "cache" / "inductor").is_dir() and not any((run2 / "cache" / "inductor").iterdir())


def test_reseed_on_restart_keeps_the_runs_entries_and_drops_partial_writes(tmp_path: Path):
    """The supervisor re-seeds a run's cache before a compile_gate retry: what the failed
    attempt completed stays (the retry hits it), its half-written temporaries go, and the
    live cache is laid over it (live entries win)."""
    tree = HostTree(str(tmp_path))
    gen = tmp_path / "cache" / ".gens" / "k-1"
    (gen / "inductor" / "fxgraph").mkdir(parents=True)
    (gen / "inductor" / "fxgraph" / "live").write_bytes(b"live")
    (gen / "inductor" / "fxgraph" / "both").write_bytes(b"from live")
    os.symlink(gen, tmp_path / "cache" / "k")
    run = tmp_path / "runs" / "r1"
    argvs = sn.seed_run_cache_argvs(tree, "k", str(run))
    for argv in argvs:
        subprocess.run(argv, check=True)
    fx = run / "cache" / "inductor" / "fxgraph"
    (fx / "attempt1").write_bytes(b"compiled by attempt 1")
    (fx / "both").write_bytes(b"changed by the run")
    (fx / ".123.456.tmp").write_bytes(b"half")                      # inductor's write_atomic
    (run / "cache" / "triton" / "tmp.pid_9_abc").mkdir(parents=True)  # triton's put()
    subprocess.run(argvs[-1], check=True)
    assert (fx / "attempt1").read_bytes() == b"compiled by attempt 1"
    assert (fx / "live").read_bytes() == b"live"
    assert (fx / "both").read_bytes() == b"from live"
    assert not (fx / ".123.456.tmp").exists()
    assert not (run / "cache" / "triton" / "tmp.pid_9_abc").exists()
    assert not (run / ".cache.tmp").exists()
    # no live cache at all: the run's own entries are still kept
    run2 = tmp_path / "runs" / "r2"
    argvs2 = sn.seed_run_cache_argvs(tree, "other", str(run2))
    for argv in argvs2:
        subprocess.run(argv, check=True)
    (run2 / "cache" / "inductor" / "e").write_bytes(b"mine")
    subprocess.run(argvs2[-1], check=True)
    assert (run2 / "cache" / "inductor" / "e").read_bytes() == b"mine"
