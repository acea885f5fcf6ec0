"""`dfo warm-cache --pull DEST` and `--from F` need no config: the key comes from the host's
store (its only snapshot) or from the snapshot's manifest, its env components re-checked on
the host. Real env roots, a real torch.compile cache on CPU, the local transport."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.engine.compile_cache import CacheManager
from orchestrator.plan import snapshot as sn
from orchestrator.config.host_tree import HostTree
from orchestrator.transport.local import LocalTransport
from tests.helpers.cache_env import CFG, typed, compile_into, make_env


@pytest.fixture(scope="module")
def cold_cache(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cold") / "cache"
    compile_into(d)
    return d


def hosts_file(path: Path, root: Path) -> Path:
    path.write_text(f"default: h\nhosts:\n  h: {{transport: local, root: {root}}}\n")
    return path


def test_pull_and_from_without_config(cold_cache, tmp_path, capsys):
    root = tmp_path / "root"
    make_env(root)
    mgr = CacheManager(LocalTransport(), HostTree(str(root)), host="h")
    key = mgr.key(typed(CFG))
    mgr.adopt(str(cold_cache), key)
    hosts = hosts_file(tmp_path / "hosts.yaml", root)
    capsys.readouterr()
    assert main(["--hosts", str(hosts), "warm-cache", "--pull", str(tmp_path / "dl"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["key"] == key.key and Path(out["tar"]).is_file()
    # a second host root with the same env restores it, again without a config
    root2 = tmp_path / "root2"
    make_env(root2)
    hosts2 = hosts_file(tmp_path / "hosts2.yaml", root2)
    assert main(["--hosts", str(hosts2), "warm-cache", "--from", out["tar"], "--json"]) == 0, \
        capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert res["action"] == "restored" and res["key"] == key.key
    assert Path(sn.paths(HostTree(str(root2)), key.key).live).is_dir()
    # two snapshots on the host: --pull without --key or --config asks which
    other = json.loads(json.dumps(CFG))
    other["model"]["attention"] = "flex"
    mgr.adopt(str(cold_cache), mgr.key(typed(other)))
    assert main(["--hosts", str(hosts), "warm-cache", "--pull", str(tmp_path / "dl2")]) == 2
    err = capsys.readouterr().err
    assert "2 snapshots on h" in err and "--key K" in err and "--data" not in err
