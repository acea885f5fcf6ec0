"""Compile-cache snapshots end to end through the ``local`` transport.

A real env root (``envs/current`` whose python runs this venv, with a fingerprint from the
deploy probe), real torch.compile caches made in subprocesses on CPU, real tar, and the
real verification. The lab versions (sshd + LXC) are in test_cache_lab.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from dfo_contract.cache_records import HashDirReply
from dfo_contract.codec import encode
from orchestrator.config.runconfig import load_config
from orchestrator.engine.compile_cache import CacheManager
from orchestrator.common.errors import CacheError, DeployError
from orchestrator.plan import snapshot as sn
from orchestrator.config.host_tree import HostTree
from orchestrator.transport.local import LocalTransport

from tests.helpers.cache_env import CFG, typed, compile_into, make_env
from tests.helpers.tmpfs import tmpfs  # noqa: F401


@pytest.fixture(scope="module")
def cold_cache(tmp_path_factory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("cold") / "cache"
    counters = compile_into(d)
    assert counters["fxgraph_cache_miss"] > 0 and counters["fxgraph_cache_hit"] == 0
    return d, counters


@pytest.fixture()
def host(tmp_path):
    root = tmp_path / "root"
    make_env(root)
    t = LocalTransport()
    return root, CacheManager(t, HostTree(str(root)), host="local")


def test_key_comes_from_the_deployed_env(host):
    root, mgr = host
    k = mgr.key(typed(CFG))
    fp = json.loads((root / "envs/current/fingerprint.json").read_text())
    assert k.components["torch.__version__"] == fp["torch"]
    assert k.components["gpu"] == "cpu"
    assert len(k.components["trainer.source"]) == 64
    assert mgr.key(typed(CFG)) == k


def test_no_env_is_a_deploy_error(tmp_path):
    mgr = CacheManager(LocalTransport(), HostTree(str(tmp_path / "empty")))
    with pytest.raises(DeployError, match="dfo deploy"):
        mgr.key(typed(CFG))


def test_adopt_wipe_restore_then_a_run_copy_hits(host, cold_cache, tmp_path):
    root, mgr = host
    src, _ = cold_cache
    key = mgr.key(typed(CFG))
    m = mgr.adopt(str(src), key)
    p = sn.paths(mgr.tree, key.key)
    assert Path(p.manifest).is_file() and Path(p.tar).stat().st_size == m.tar.size
    assert m.sizes.inductor > 0
    assert Path(p.live).is_symlink()
    # wipe the live cache, restore from the store
    shutil.rmtree(os.path.realpath(p.live))
    os.unlink(p.live)
    mgr.restore_from_store(key)
    assert Path(p.live, "inductor").is_dir()
    # a run works on its own copy, at another path, and gets cache hits
    run = tmp_path / "runs" / "r1"
    for argv in sn.seed_run_cache_argvs(mgr.tree, key.key, str(run)):
        subprocess.run(argv, check=True)
    env = sn.cache_env(mgr.tree, key.key, str(run))
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(run / "cache" / "inductor")
    warm = compile_into(run / "cache")
    assert warm["fxgraph_cache_hit"] > 0 and warm["fxgraph_cache_miss"] == 0
    assert warm["autograd_cache_hit"] > 0
    # the shared live cache was not written by the run
    assert sn.file_problems(m.files, mgr.store.tool("hashdir", p.live, reply=HashDirReply).files) == []


def test_key_mismatch_is_refused_naming_the_component(host, cold_cache):
    root, mgr = host
    key = mgr.key(typed(CFG))
    mgr.adopt(str(cold_cache[0]), key)
    p = sn.paths(mgr.tree, key.key)
    live_before = os.readlink(p.live)
    # the env changes under the snapshot: another torch build
    make_env(root, torch="2.13.0+cu130", torch_cuda="13.0")
    new = mgr.key(typed(CFG))
    assert new.key != key.key
    with pytest.raises(CacheError) as e:
        mgr.push(Path(p.tar), new)
    msg = str(e.value)
    assert "torch.__version__: snapshot" in msg and "env 2.13.0+cu130" in msg
    assert "torch.version.cuda: snapshot none, env 13.0" in msg
    assert e.value.exit_code == 8
    assert os.readlink(p.live) == live_before


@pytest.mark.parametrize("damage", ["truncate", "flip", "member"])
def test_corrupt_snapshot_is_refused_and_live_cache_untouched(host, cold_cache, tmp_path, damage):
    root, mgr = host
    key = mgr.key(typed(CFG))
    m = mgr.adopt(str(cold_cache[0]), key)
    p = sn.paths(mgr.tree, key.key)
    copy = tmp_path / "pulled"
    tar, man = mgr.pull(key.key, copy)
    live_target = os.readlink(p.live)
    live_files = mgr.store.tool("hashdir", p.live, reply=HashDirReply).files
    data = bytearray(tar.read_bytes())
    if damage == "truncate":
        tar.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
        tar.write_bytes(bytes(data))
    else:  # a consistent tar (its checksum recomputed into the manifest) whose member changed
        work = tmp_path / "unpacked"
        with tarfile.open(tar) as tf:
            tf.extractall(work, filter="data")
        victim = next(f for f in sorted(work.rglob("*")) if f.is_file() and f.stat().st_size > 0)
        victim.write_bytes(b"poison" + victim.read_bytes())
        subprocess.run(["tar", "-cf", str(tar), "-C", str(work), "inductor", "triton", "mega"], check=True)
        mm = json.loads(man.read_text())
        from orchestrator.engine.compile_cache import _hash_local
        mm["tar"].update(encode(_hash_local(tar)))
        man.write_text(json.dumps(mm))
    with pytest.raises(CacheError) as e:
        mgr.push(tar, key)
    assert {"truncate": "truncated", "flip": "corrupt", "member": "fails its checksums"}[damage] in str(e.value)
    assert os.readlink(p.live) == live_target
    assert mgr.store.tool("hashdir", p.live, reply=HashDirReply).files == live_files == m.files
    # nothing half-made is left beside it
    assert [x.name for x in Path(root, "cache", ".gens").iterdir()] == [os.path.basename(live_target)]
    assert not [x for x in Path(p.tar).parent.iterdir() if x.name.startswith(".")]


def test_store_corruption_is_refused_on_restore(host, cold_cache):
    root, mgr = host
    key = mgr.key(typed(CFG))
    mgr.adopt(str(cold_cache[0]), key)
    p = sn.paths(mgr.tree, key.key)
    live_target = os.readlink(p.live)
    with open(p.tar, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(CacheError, match="truncated"):
        mgr.restore_from_store(key)
    assert os.readlink(p.live) == live_target


def test_pull_push_between_two_roots_restores_hits(host, cold_cache, tmp_path):
    root, mgr = host
    key = mgr.key(typed(CFG))
    mgr.adopt(str(cold_cache[0]), key)
    tar, man = mgr.pull(key.key, tmp_path / "local-copy")
    assert tar.name == f"{key.key}.tar" and man.is_file()
    # a second, freshly built host root with the same env
    root2 = tmp_path / "root2"
    make_env(root2)
    mgr2 = CacheManager(LocalTransport(), HostTree(str(root2)), host="second")
    key2 = mgr2.key(typed(CFG))
    assert key2.key == key.key
    with pytest.raises(CacheError, match="was built on local"):  # another host built it
        mgr2.push(tar, key2)
    mgr2.push(tar, key2, trust_other_hosts=True)
    p2 = sn.paths(mgr2.tree, key2.key)
    assert Path(p2.manifest).is_file()
    run = tmp_path / "runs2" / "r"
    for argv in sn.seed_run_cache_argvs(mgr2.tree, key2.key, str(run)):
        subprocess.run(argv, check=True)
    warm = compile_into(run / "cache")
    assert warm["fxgraph_cache_hit"] > 0 and warm["fxgraph_cache_miss"] == 0


def test_status_and_prune(host, cold_cache, tmp_path):
    root, mgr = host
    keys = []
    for attention in ("sdpa", "flex", "flex-eager"):
        cfg = json.loads(json.dumps(CFG))
        cfg["model"]["attention"] = attention
        k = mgr.key(typed(cfg))
        mgr.adopt(str(cold_cache[0]), k)
        keys.append(k.key)
        os.utime(sn.paths(mgr.tree, k.key).used, (1e9 + len(keys), 1e9 + len(keys)))
    entries, _ = mgr.status()
    assert [e.key for e in entries] == keys[::-1]
    assert all(e.snapshot_size and e.live_size for e in entries)
    removed = mgr.prune(1)
    assert sorted(removed) == sorted(keys[:2])
    entries, raw = mgr.status()
    assert [e.key for e in entries] == [keys[2]]
    assert raw.stale == []
    assert not Path(sn.paths(mgr.tree, keys[0]).tar).exists()


def test_load_config_uses_the_trainer_validation(tmp_path):
    from orchestrator.common.errors import ConfigError

    f = tmp_path / "c.yaml"
    f.write_text("data: {path: /x.jsonl, max_seq_len: 64, num_anchors: 4}\n")
    cfg, text = load_config(f, [("model.attention", "sdpa")])
    assert cfg["model"]["attention"] == "sdpa" and text == f.read_bytes()
    with pytest.raises(ConfigError, match="train.micro_batch"):
        load_config(f, [("train.micro_batch", "0")])


def test_cli_pull_by_key_and_status_json(host, cold_cache, tmp_path, capsys):
    from orchestrator.cli import main

    root, mgr = host
    key = mgr.key(typed(CFG))
    mgr.adopt(str(cold_cache[0]), key)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"default: h\nhosts:\n  h: {{transport: local, root: {root}}}\n")
    capsys.readouterr()
    assert main(["--hosts", str(hosts), "warm-cache", "--pull", str(tmp_path / "dl"), "--key", key.key,
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert Path(out["tar"]).read_bytes() == Path(sn.paths(mgr.tree, key.key).tar).read_bytes()
    assert main(["--hosts", str(hosts), "warm-cache", "--status", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["keys"][0]["key"] == key.key and st["removed"] is None
    # a key that is not there: exit 11, one line
    assert main(["--hosts", str(hosts), "warm-cache", "--pull", str(tmp_path), "--key", "cpu-nope"]) == 11
    err = capsys.readouterr().err
    assert "no snapshot for key cpu-nope" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("where", ["existing_file", "file_as_parent", "proc"])
def test_pull_into_a_bad_destination_is_one_line(host, cold_cache, tmp_path, capsys, where):
    from orchestrator.cli import main

    root, mgr = host
    key = mgr.key(typed(CFG))
    mgr.adopt(str(cold_cache[0]), key)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"default: h\nhosts:\n  h: {{transport: local, root: {root}}}\n")
    (tmp_path / "afile").write_text("keep me\n")
    dest = {"existing_file": tmp_path / "afile",
            "file_as_parent": tmp_path / "afile" / "x.tar",
            "proc": Path("/proc/self/dfo-nope/x.tar")}[where]
    capsys.readouterr()
    assert main(["--hosts", str(hosts), "warm-cache", "--pull", str(dest), "--key", key.key]) == 2
    err = capsys.readouterr().err
    assert err.strip().startswith(f"dfo: error: --pull {dest}:") and len(err.strip().splitlines()) == 1
    assert (tmp_path / "afile").read_text() == "keep me\n"


@pytest.mark.parametrize("into", ["directory", "tar_path"])
def test_pull_into_a_read_only_mount_is_one_line(host, cold_cache, tmp_path, capsys, tmpfs,  # noqa: F811
                                                 into):
    from orchestrator.cli import main

    root, mgr = host
    key = mgr.key(typed(CFG))
    mgr.adopt(str(cold_cache[0]), key)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"default: h\nhosts:\n  h: {{transport: local, root: {root}}}\n")
    ro = tmpfs(1 << 20)
    subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True, timeout=60)
    dest = ro if into == "directory" else ro / "x.tar"
    capsys.readouterr()
    assert main(["--hosts", str(hosts), "warm-cache", "--pull", str(dest), "--key", key.key]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dfo: error: --pull {dest}: cannot write ") and err.count("\n") == 1, err
    assert "Read-only file system" in err and "(pull into a writable directory)" in err
    assert os.listdir(ro) == []


def test_a_second_warmup_on_the_same_host_is_refused_while_one_runs(host):
    """The warm-up holds <root>/locks/cache.lock (flock): a concurrent one fails at once."""
    import time

    from orchestrator.common.errors import LockHeldError

    root, mgr = host
    lock = root / "locks" / "cache.lock"
    lock.parent.mkdir(exist_ok=True)
    holder = subprocess.Popen(["flock", str(lock), "sleep", "60"])
    try:
        deadline = time.time() + 60         # only ends a broken run: flock is starting
        while subprocess.run(["flock", "-n", str(lock), "true"]).returncode == 0:
            assert time.time() < deadline, "the holder never took the lock"
            time.sleep(0.05)
        key = mgr.key(typed(CFG))
        with pytest.raises(LockHeldError, match="another warm-up"):
            mgr.warm(key, b"", [], measure=False)
        # the refused warm-up left nothing behind and made nothing live
        gens = root / "cache" / ".gens"
        assert not gens.exists() or not list(gens.iterdir())
        assert not (root / "cache" / key.key).exists()
    finally:
        holder.kill()
        holder.wait()
