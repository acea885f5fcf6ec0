"""warm-cache with the real trainer warm-up (``python -m trainer warmup``) on CPU, through
the ``local`` transport and the CLI end to end (``dfo warm-cache`` on a local host: warm +
check + snapshot, restore, --json, --status, --pull/--push, and the pushed host's next
warm-up HITS; the wipe and restore through a container: test_cache_lab). Assertions are on
torch's cache counters, never on wall time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


from orchestrator.plan.trainer_warmup import parse_report, warmup_argv
from orchestrator.plan import snapshot as sn
from orchestrator.config.host_tree import HostTree
from tests.helpers.cache_env import make_env

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny random target and a config with one shape bucket (CPU, compiled drafter step)."""
    d = tmp_path_factory.mktemp("tiny")
    subprocess.run([sys.executable, "-m", "trainer.model.target", "--out", str(d / "target")],
                   check=True, capture_output=True, timeout=300)
    (d / "cfg.yaml").write_text(
        f"model: {{target_path: {d / 'target'}, drafter_layers: 1, block_size: 4}}\n"
        f"data: {{path: {d / 'unused.jsonl'}, max_seq_len: 32, num_anchors: 4}}\n"
        "parallel: {target_devices: [cpu], drafter_devices: [cpu]}\n"
        "compile: {enabled: true}\n")
    return d


def run_warmup(root: Path, key: str, run_dir: Path, cfg: Path) -> dict:
    """The trainer's next warm-up in a run that got its own copy of the live cache."""
    tree = HostTree(str(root))
    for argv in sn.seed_run_cache_argvs(tree, key, str(run_dir)):
        subprocess.run(argv, check=True)
    env = dict(os.environ, **sn.cache_env(tree, key, str(run_dir)))
    report = run_dir / "report.json"
    r = subprocess.run(warmup_argv(str(root / "envs/current/bin/python"), str(cfg), [], str(report)),
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    _, totals, _ = parse_report(report.read_bytes())
    return totals


def _dfo(*args, hosts: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "--hosts", str(hosts), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=900)


def test_cli_warm_restore_status_pull_push(tmp_path, tiny):
    root, root2 = tmp_path / "root", tmp_path / "root2"
    make_env(root)
    make_env(root2)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"default: a\nhosts:\n  a: {{transport: local, root: {root}}}\n"
                     f"  b: {{transport: local, root: {root2}}}\n")
    cfg = str(tiny / "cfg.yaml")

    r = _dfo("warm-cache", "--config", cfg, "--json", hosts=hosts, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # cold: compiled (misses); the check run on the saved cache: hits only
    assert out["action"] == "warmed" and out["counters"]["fxgraph_cache_miss"] > 0
    assert out["counters"]["fxgraph_cache_hit"] == 0
    assert out["warm_counters"]["fxgraph_cache_hit"] > 0 and out["warm_counters"]["fxgraph_cache_miss"] == 0
    assert out["components"]["gpu"] == "cpu" and out["snapshot_size"] > 0
    key = out["key"]
    p = sn.paths(HostTree(str(root)), key)
    m = sn.parse_manifest(Path(p.manifest).read_bytes(), "m")
    assert m.key == key and m.tar.size == Path(p.tar).stat().st_size
    assert any(f.startswith("inductor/fxgraph/") for f in m.files)
    assert m.sizes.mega > 0  # torch.compiler.save_cache_artifacts() went in
    assert [(w["device"], w["shape"]) for w in out["records"]] == [("cpu", [32, 4])]
    assert m.warmup and m.warmup.shapes == 1 and m.warmup.warm_counters == out["warm_counters"]
    # nothing temporary left, one generation of the live cache
    assert not list((root / "cache").glob(".work/*"))
    assert [x.name for x in (root / "cache" / ".gens").iterdir()] == [os.path.basename(os.readlink(p.live))]

    # a snapshot exists now: the same command restores it instead of warming
    r = _dfo("warm-cache", "--config", cfg, "--json", hosts=hosts, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["action"] == "restored"

    r = _dfo("warm-cache", "--status", "--json", hosts=hosts, cwd=tmp_path)
    st = json.loads(r.stdout)
    assert [k["key"] for k in st["keys"]] == [key] and st["keys"][0]["snapshot_size"] > 0

    # people get a table
    r = _dfo("warm-cache", "--status", hosts=hosts, cwd=tmp_path)
    assert r.returncode == 0 and key in r.stdout

    # pull from a, push into b (a freshly built root), then b's next warm-up hits
    r = _dfo("warm-cache", "--config", cfg, "--pull", str(tmp_path / "dl"), "--json", hosts=hosts, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    tar = Path(json.loads(r.stdout)["tar"])
    assert tar.is_file()
    r = _dfo("warm-cache", "--host", "b", "--config", cfg, "--push", str(tar), hosts=hosts, cwd=tmp_path)
    assert r.returncode == 8 and "was built on a" in r.stderr and "--trust-other-hosts" in r.stderr
    r = _dfo("warm-cache", "--host", "b", "--config", cfg, "--push", str(tar), "--trust-other-hosts", "--json",
             hosts=hosts, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["action"] == "pushed"
    warm = run_warmup(root2, key, tmp_path / "run-b", tiny / "cfg.yaml")
    assert warm["fxgraph_cache_hit"] > 0 and warm["fxgraph_cache_miss"] == 0

    # a changed env on b: the same tar is refused, exit 8, one line naming the component
    fp = json.loads((root2 / "envs/current/fingerprint.json").read_text())
    fp["torch"] = "2.13.0+cu130"
    (root2 / "envs/current/fingerprint.json").write_text(json.dumps(fp))
    r = _dfo("warm-cache", "--host", "b", "--config", cfg, "--from", str(tar), hosts=hosts, cwd=tmp_path)
    assert r.returncode == 8
    assert "torch.__version__: snapshot" in r.stderr and "env 2.13.0+cu130" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr

    # bad usage is a one-line config error
    r = _dfo("warm-cache", "--status", "--prune", "1", hosts=hosts, cwd=tmp_path)
    assert r.returncode == 2 and "cannot be combined" in r.stderr
