"""``model.init_from`` on the host, through the real CLI and the ``local`` transport: dfo
launch reads the drafter directory's config.json in its one pre-launch round trip (and dfo
warm-cache with the same probe), so the compile-cache key follows the drafter's compiled
settings and a directory the trainer would refuse is refused first, in one line, with
nothing written. A real env root (``envs/current`` whose python runs this venv)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.config.hostconfig import HostConfig
from orchestrator.config.runconfig import load_layers
from orchestrator.engine.compile_cache import CacheManager
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.config.host_tree import HostTree
from orchestrator.transport.local import LocalTransport
from tests.helpers.rtt import CountingTransport
from tests.supervisor_env import dfo

DRAFTER = {"architectures": ["DFlashDraftModel"], "num_hidden_layers": 2, "hidden_size": 64,
           "vocab_size": 128, "num_target_layers": 4, "is_causal": False,
           "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 3, "block_size": 8}}
FP = {"profile": "cpu", "lock_hash": "0" * 64, "python": "3.11", "torch": "2.13.0+cpu",
      "devices": [], "cuda_available": False, "device_count": 0}


@pytest.fixture
def host(tmp_path):
    """A root whose envs/current runs this interpreter, a run config that leaves the drafter's
    settings unset, its target and data, and hosts.yaml."""
    env = tmp_path / "root" / "envs" / "e1"
    (env / "bin").mkdir(parents=True)
    py = env / "bin" / "python"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    (env / "fingerprint.json").write_text(json.dumps(FP))
    (env.parent / "current").symlink_to("e1")
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    (tmp_path / "data.jsonl").write_text("")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": {"target_path": str(tmp_path / "target"), "attention": "sdpa",
                  "init_from": str(tmp_path / "d8")},
        "data": {"path": str(tmp_path / "data.jsonl"), "max_seq_len": 64, "num_anchors": 8},
        "parallel": {"target_devices": ["cpu"], "drafter_devices": ["cpu"]},
        "compile": {"enabled": True}}))
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"default: local\nhosts:\n  local:\n    transport: local\n"
                     f"    root: {tmp_path / 'root'}\n")
    return tmp_path, cfg, hosts


def drafter(d: Path, layers: int = 2, **dflash) -> str:
    """A drafter directory's config.json (all dfo reads of it before the trainer runs)."""
    d.mkdir()
    conf = json.loads(json.dumps(DRAFTER))
    conf["num_hidden_layers"] = layers
    conf["dflash_config"].update(dflash)
    (d / "config.json").write_text(json.dumps(conf))
    return str(d)


def launch_key(capsys, hosts, cfg, *sets) -> str:
    args = ["launch", "--config", str(cfg), "--dry-run", "--json", "--no-env-check"]
    for s in sets:
        args += ["--set", s]
    rc, out, err = dfo(capsys, hosts, *args)
    assert rc == 0, err
    return json.loads(out)["env"]["DFO_CACHE_KEY"]


def test_the_cache_key_follows_the_drafter_directory_not_only_the_config_file(host, capsys):
    tmp, cfg, hosts = host
    drafter(tmp / "d8")                      # the one the config file names
    k8 = launch_key(capsys, hosts, cfg)
    # the same directory, now a drafter of block size 16: the same file, another key
    conf = json.loads((tmp / "d8" / "config.json").read_text())
    conf["dflash_config"]["block_size"] = 16
    (tmp / "d8" / "config.json").write_text(json.dumps(conf))
    k16 = launch_key(capsys, hosts, cfg)
    assert k16 != k8
    # dfo warm-cache keys the same config the same way (its own probe of the directory)
    mgr = CacheManager(LocalTransport(), HostTree(str(tmp / "root")), host="local")
    layers = load_layers(cfg)
    k = mgr.key(layers.config, source=str(cfg))
    assert k.key == k16 and k.components["config.model.block_size"] == "16"
    assert k.components["config.model.drafter_layers"] == "2"
    # where a drafter lives is not compiled: a copy of the block-8 drafter is the block-8 key;
    # a layer count of its own is another key
    copy8 = drafter(tmp / "copy8")
    assert launch_key(capsys, hosts, cfg, f"model.init_from={copy8}") == k8
    three = drafter(tmp / "d3", layers=3)
    assert launch_key(capsys, hosts, cfg, f"model.init_from={three}") not in (k8, k16)


def test_the_drafter_directory_is_read_in_launchs_one_round_trip(host):
    tmp, cfg, _ = host
    drafter(tmp / "d8")
    t = CountingTransport(LocalTransport())
    run_ops = RunOps(t, HostConfig(name="local", transport="local", root=str(tmp / "root"),
                               source="test"))
    plan = run_ops.plan(LaunchOptions(config=str(cfg), dry_run=True, env_check=False))
    assert len(t.calls) == 1, t.calls
    mgr = CacheManager(LocalTransport(), HostTree(str(tmp / "root")), host="local")
    layers = load_layers(cfg)
    key = mgr.key(layers.config)
    assert plan.spec.cache.key == key.key and key.components["config.model.block_size"] == "8"


@pytest.mark.parametrize("setup,sets,want", [
    (None, (), "model.init_from of {cfg}: {tmp}/d8 does not exist on local (fix model.init_from "
               "in {cfg} or pass --set model.init_from=DIR)"),
    (lambda d: d.mkdir(), (), "model.init_from of {cfg} on local: --model.init_from: {tmp}/d8: "
                              "no config.json (give an exported DFlash drafter directory)"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text("{torn")), (),
     "--model.init_from: {tmp}/d8: config.json is not readable JSON"),
    (lambda d: drafter(d), ("model.block_size=16",),
     "--model.block_size: 16 conflicts with the drafter's 8 in --model.init_from {tmp}/d8; "
     "drop --model.block_size or set it to 8"),
])
def test_a_bad_init_from_directory_is_refused_in_one_line_and_nothing_is_written(
        host, capsys, setup, sets, want):
    tmp, cfg, hosts = host
    if setup:
        setup(tmp / "d8")
    args = ["launch", "--config", str(cfg), "--no-env-check"]
    for s in sets:
        args += ["--set", s]
    rc, out, err = dfo(capsys, hosts, *args)
    assert rc == 2 and err.startswith("dfo: error: ") and err.count("\n") == 1, err
    assert want.format(cfg=cfg, tmp=tmp) in err and "Traceback" not in err
    assert not (tmp / "root" / "runs").exists() and not (tmp / "root" / "checkpoints").exists()
