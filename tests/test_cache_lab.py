"""`dfo warm-cache` against the real lab: sshd "Proxmox node" + LXC container 200 through
the pct stand-in, the CPU profile deployed offline by the real `dfo deploy` (uv, wheelhouse),
the real trainer warm-up inside the container. Assertions are on torch's cache counters.

The env is deployed once per session and host under its own root, so these tests never
disturb the deploy tests' root. Inductor on CPU needs a C++ compiler on the host: the
``lab`` container must have g++ (tests/lab/container.py PACKAGES); without one its tests
skip with that reason (fail under CI).
"""

from __future__ import annotations

import json
import os
import posixpath
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.config.inventory import HostConfig, load_inventory
from orchestrator.plan import snapshot as sn
from orchestrator.transport import Transport, open_transport

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800)]

ROOT = "/root/dfo-cache-test"
DFO = [sys.executable, "-c", "import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))"]


@dataclass
class CacheLab:
    hosts: Path
    host: HostConfig
    t: Transport
    cfg: Path          # local config file; its paths are in the container
    tmp: Path


def rsh(t: Transport, script: str, *args: str, timeout: float = 120) -> str:
    """A constant bash script with values as positional parameters, in the container."""
    r = t.run(["bash", "-c", script, "x", *args], timeout=timeout)
    assert r.ok, r.err
    return r.out


def dfo(lab: CacheLab, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([*DFO, "--hosts", str(lab.hosts), "warm-cache", "--host", lab.host.name, *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session", params=["lab"])
def cache_lab(request, lab, lab_wheelhouse, project_wheel, tmp_path_factory) -> CacheLab:
    """The CPU profile deployed by `dfo deploy` on ``lab`` (proxmox: SSH to the node, then
    ``pct exec`` into container 200). A plain SSH host runs the same transport calls
    (test_transport_lab, test_launch_lab); warm-cache asks nothing of the transport beyond
    them."""
    from orchestrator.engine.deploy import Deployer

    base = tmp_path_factory.mktemp(f"cache-{request.param}")
    hosts = base / "hosts.yaml"
    hosts.write_text(lab.hosts_yaml(root=ROOT, node_root=str(Path(lab.state_dir) / "cache-node-root"),
                                    wheelhouse=True))
    host = load_inventory(str(hosts)).get(request.param)
    t = open_transport(host)
    if not t.run(["sh", "-c", "command -v g++ || command -v c++"], timeout=60).ok:
        t.close()
        msg = (f"{request.param} has no C++ compiler, and inductor on CPU needs one: "
               "add g++ to PACKAGES in tests/lab/container.py")
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    t.run(["rm", "-rf", host.root], timeout=120, check=True)
    Deployer(t, host, wheel=project_wheel).deploy()
    target = posixpath.join(host.root, "target")
    t.run([host.tree.current_python, "-m", "trainer.model.target", "--out", target], timeout=600, check=True)
    cfg = base / "tiny-cpu-cache.yaml"
    cfg.write_text(f"model: {{target_path: {target}, drafter_layers: 1, block_size: 4}}\n"
                   f"data: {{path: {host.root}/unused.jsonl, max_seq_len: 32, num_anchors: 4}}\n"
                   "parallel: {target_devices: [cpu], drafter_devices: [cpu]}\n"
                   "compile: {enabled: true}\n")
    yield CacheLab(hosts, host, t, cfg, base)
    t.run(["rm", "-rf", host.root], timeout=120)
    t.close()


def next_warmup_counters(lab: CacheLab, key: str, run: str) -> dict:
    """The trainer's warm-up in the container, in a run that got its own copy of the cache."""
    tree = lab.host.tree
    for argv in sn.seed_run_cache_argvs(tree, key, run):
        lab.t.run(argv, timeout=300, check=True)
    cfg = posixpath.join(run, "config.yaml")
    lab.t.put(lab.cfg.read_bytes(), cfg)
    report = posixpath.join(run, "report.json")
    r = lab.t.run([tree.current_python, "-m", "trainer", "warmup", "--config", cfg, "--report", report],
                  env=sn.cache_env(tree, key, run), timeout=900)
    assert r.ok, (r.out + r.err)[-3000:]
    return json.loads(lab.t.get(report))["totals"]


def live_target(lab: CacheLab, key: str) -> str:
    return rsh(lab.t, 'readlink "$1" || true', sn.paths(lab.host.tree, key).live).strip()


# the whole round trip through the container (SSH, then pct exec); the local transport's
# pushed snapshot is warmed on in test_cache_warm
def test_lab_warm_wipe_restore_hits_then_pull_push(cache_lab: CacheLab):
    lab = cache_lab
    r = dfo(lab, "--config", str(lab.cfg), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    key = out["key"]
    assert out["action"] == "warmed"
    assert out["counters"]["fxgraph_cache_miss"] > 0 and out["counters"]["fxgraph_cache_hit"] == 0
    assert out["warm_counters"]["fxgraph_cache_hit"] > 0 and out["warm_counters"]["fxgraph_cache_miss"] == 0
    assert out["components"]["torch.__version__"].endswith("+cpu")

    # wipe the live cache in the container; warm-cache restores the stored snapshot
    p = sn.paths(lab.host.tree, key)
    rsh(lab.t, 'rm -rf "$(readlink -f "$1")" "$1"', p.live)
    r = dfo(lab, "--config", str(lab.cfg), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["action"] == "restored"
    hits = next_warmup_counters(lab, key, f"{lab.host.root}/runs/after-restore")
    assert hits["fxgraph_cache_hit"] > 0 and hits["fxgraph_cache_miss"] == 0

    # pull to this machine; "rebuild" the container's cache (all of it gone); push it back
    r = dfo(lab, "--config", str(lab.cfg), "--pull", str(lab.tmp / "pulled"), "--json")
    assert r.returncode == 0, r.stderr
    tar = Path(json.loads(r.stdout)["tar"])
    assert tar.is_file() and tar.with_name(f"{key}.manifest.json").is_file()
    lab.t.run(["rm", "-rf", lab.host.tree.cache], timeout=120, check=True)
    r = dfo(lab, "--config", str(lab.cfg), "--push", str(tar), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["action"] == "pushed"
    assert live_target(lab, key)       # the pushed snapshot is the live cache again

    r = dfo(lab, "--status", "--json")
    st = json.loads(r.stdout)
    assert [k["key"] for k in st["keys"]] == [key]


def test_lab_mismatch_and_corruption_refused_live_untouched(cache_lab: CacheLab):
    lab = cache_lab
    r = dfo(lab, "--config", str(lab.cfg), "--json", "--no-check")
    assert r.returncode == 0, r.stderr
    key = json.loads(r.stdout)["key"]
    r = dfo(lab, "--config", str(lab.cfg), "--pull", str(lab.tmp / "snap"), "--json")
    assert r.returncode == 0, r.stderr
    tar = Path(json.loads(r.stdout)["tar"])
    before = live_target(lab, key)
    assert before

    # corruption: a flipped byte, then a truncated tar
    data = bytearray(tar.read_bytes())
    bad = lab.tmp / "bad"
    bad.mkdir()
    (bad / tar.name).write_bytes(bytes(data[:-4096]))
    (bad / f"{key}.manifest.json").write_bytes(tar.with_name(f"{key}.manifest.json").read_bytes())
    r = dfo(lab, "--config", str(lab.cfg), "--push", str(bad / tar.name))
    assert r.returncode == 8 and "truncated" in r.stderr, r.stderr
    data[len(data) // 3] ^= 0x55
    (bad / tar.name).write_bytes(bytes(data))
    r = dfo(lab, "--config", str(lab.cfg), "--from", str(bad / tar.name))
    assert r.returncode == 8 and "corrupt" in r.stderr, r.stderr
    assert live_target(lab, key) == before

    # the store's own tar damaged in the container: restore refuses it
    p = sn.paths(lab.host.tree, key)
    rsh(lab.t, 'rm -rf "$(readlink -f "$1")" "$1"; truncate -s 1000 "$2"', p.live, p.tar)
    r = dfo(lab, "--config", str(lab.cfg))
    assert r.returncode == 8 and "truncated" in r.stderr, r.stderr
    assert live_target(lab, key) == ""
    r = dfo(lab, "--config", str(lab.cfg), "--push", str(tar), "--json")  # the good copy repairs it
    assert r.returncode == 0, r.stderr
    before = live_target(lab, key)

    # the env changes under the snapshot (another torch build): refused, component named
    fp_path = posixpath.join(lab.host.tree.current_env, "fingerprint.json")
    orig = lab.t.get(fp_path)
    fp = json.loads(orig)
    fp["torch"], fp["torch_cuda"] = "2.13.0+cu130", "13.0"
    try:
        lab.t.put(json.dumps(fp).encode(), fp_path)
        r = dfo(lab, "--config", str(lab.cfg), "--push", str(tar))
        assert r.returncode == 8, r.stderr
        assert "torch.version.cuda: snapshot none, env 13.0" in r.stderr
        assert "env 2.13.0+cu130" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    finally:
        lab.t.put(orig, fp_path)
    assert live_target(lab, key) == before


# ------------------------------------------------------------------------------------------
# Container mechanics through `pct exec` that need no compiler: adopt, snapshot, pull, push,
# verification, refusals, per-run copies, status and prune, all inside container 200.

MECH_ROOT = "/root/dfo-cache-mech"


@pytest.fixture(scope="session")
def container_env(lab, lab_wheelhouse, project_wheel, tmp_path_factory):
    from orchestrator.engine.deploy import Deployer

    base = tmp_path_factory.mktemp("cache-mech")
    hosts = base / "hosts.yaml"
    hosts.write_text(lab.hosts_yaml(root=MECH_ROOT, wheelhouse=True))
    host = load_inventory(str(hosts)).get("lab")
    t = open_transport(host)
    t.run(["rm", "-rf", MECH_ROOT], timeout=120, check=True)
    Deployer(t, host, wheel=project_wheel).deploy()
    yield hosts, host, t, base
    t.run(["rm", "-rf", MECH_ROOT], timeout=120)
    t.close()


def test_lab_container_snapshot_mechanics(container_env, tmp_path):
    from orchestrator.engine.compile_cache import CacheManager
    from orchestrator.common.errors import CacheError
    from dfo_contract.cache_records import HashDirReply
    from tests.helpers.cache_env import CFG, typed, compile_into

    hosts, host, t, base = container_env
    # real inductor files (made on this machine: dfo treats cache contents as opaque bytes)
    local = tmp_path / "made"
    compile_into(local)
    src = posixpath.join(MECH_ROOT, "incoming")
    for f in sorted(local.rglob("*")):
        if f.is_file():
            t.put(f, posixpath.join(src, str(f.relative_to(local))))
    mgr = CacheManager(t, host.tree, host="lab", timeout=300)
    key = mgr.key(typed(CFG))
    assert key.components["python"].startswith("3.11") and key.components["gpu"] == "cpu"
    m = mgr.adopt(src, key)
    p = sn.paths(host.tree, key.key)
    assert m.sizes.inductor > 0
    assert mgr.store.tool("hashdir", p.live, reply=HashDirReply).files == m.files

    # pull to this machine, wipe everything of the cache in the container, push back
    tar, man = mgr.pull(key.key, tmp_path / "pulled")
    t.run(["rm", "-rf", host.tree.cache], timeout=60, check=True)
    mgr.push(tar, key)
    assert mgr.store.tool("hashdir", p.live, reply=HashDirReply).files == m.files
    live = rsh(t, 'readlink "$1"', p.live).strip()

    # truncated and corrupt copies are refused; the live cache stays
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / man.name).write_bytes(man.read_bytes())
    data = tar.read_bytes()
    (bad / tar.name).write_bytes(data[: len(data) - 3000])
    with pytest.raises(CacheError, match="truncated"):
        mgr.push(bad / tar.name, key)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    (bad / tar.name).write_bytes(bytes(flipped))
    with pytest.raises(CacheError, match="corrupt"):
        mgr.push(bad / tar.name, key)
    # the store's tar damaged inside the container
    rsh(t, 'printf x >> "$1"', p.tar)
    with pytest.raises(CacheError, match="truncated"):
        mgr.restore_from_store(key)
    assert rsh(t, 'readlink "$1"', p.live).strip() == live
    assert mgr.store.tool("hashdir", p.live, reply=HashDirReply).files == m.files

    # another torch build under the snapshot: refused, naming the components
    fp_path = posixpath.join(host.tree.current_env, "fingerprint.json")
    orig = t.get(fp_path)
    fp = json.loads(orig)
    fp["torch"], fp["torch_cuda"] = "2.13.0+cu130", "13.0"
    try:
        t.put(json.dumps(fp).encode(), fp_path)
        with pytest.raises(CacheError) as e:
            mgr.push(tar, mgr.key(typed(CFG)))
        assert "torch.version.cuda: snapshot none, env 13.0" in str(e.value)
    finally:
        t.put(orig, fp_path)
    assert rsh(t, 'readlink "$1"', p.live).strip() == live

    # a run's own copy inside the container; writing to it leaves the live cache alone
    run = posixpath.join(MECH_ROOT, "runs", "r1")
    for argv in sn.seed_run_cache_argvs(host.tree, key.key, run):
        t.run(argv, timeout=120, check=True)
    rsh(t, 'for f in $(find "$1/cache/inductor" -type f | head -3); do echo poison >> "$f"; done', run)
    assert mgr.store.tool("hashdir", p.live, reply=HashDirReply).files == m.files

    # status and prune through the CLI
    r = subprocess.run([*DFO, "--hosts", str(hosts), "warm-cache", "--host", "lab", "--status", "--json"],
                       capture_output=True, text=True, timeout=300)
    # the store's tar was damaged above (one byte appended): --status flags it, exit 8
    assert r.returncode == 8 and f"{key.key}: snapshot {key.key}.tar is truncated" in r.stderr, r.stderr
    keys = json.loads(r.stdout)["keys"]
    assert [k["key"] for k in keys] == [key.key] and "truncated" in keys[0]["problem"]
    r = subprocess.run([*DFO, "--hosts", str(hosts), "warm-cache", "--host", "lab", "--prune", "0", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["removed"] == [key.key] and out["keys"] == []
    assert not t.run(["test", "-e", p.tar], timeout=60).ok

    # a snapshot with `inductor/xx -> /elsewhere` planted in the container's store (its
    # checksums consistent): the restore refuses it inside the container, writes nothing
    # outside, and --status flags it
    from tests.test_cache_trust import _with_symlink

    evil = tmp_path / "evil"
    evil.mkdir()
    etar, eman = evil / tar.name, evil / man.name
    etar.write_bytes(tar.read_bytes())
    eman.write_bytes(man.read_bytes())
    elsewhere = posixpath.join(MECH_ROOT, "elsewhere")
    _with_symlink(etar, eman, elsewhere)
    t.run(["mkdir", "-p", host.tree.snapshots], timeout=60, check=True)
    t.put(etar, p.tar)
    t.put(eman, p.manifest)
    with pytest.raises(CacheError, match=f"inductor/xx is a symlink \\(to {elsewhere}\\)"):
        mgr.restore_from_store(key)
    assert not t.run(["test", "-e", elsewhere], timeout=60).ok
    assert not t.run(["test", "-e", p.live], timeout=60).ok
    entries, _ = mgr.status(verify=True)
    assert "inductor/xx is a symlink" in entries[0].problem
