"""What `dfo launch` refuses when it plans, through the real CLI on the local transport: a
device the host's deployed env does not have (dry run and real launch alike), and a fresh
launch into a run name whose checkpoints an earlier run left (naming the newest)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from dfo_contract.checkpoints import write_manifest
from dfo_contract.env_fingerprint import EnvFingerprint
from orchestrator.plan.devices import check_devices
from orchestrator.common.errors import ConfigError
from tests.supervisor_env import VENV, dfo, hosts_yaml


@pytest.fixture
def env(tmp_path):
    """A host root whose deployed env is this venv seen through its own directory, with a
    fingerprint.json that says what torch found on the host: no CUDA device."""
    root = tmp_path / "root"
    cur = root / "envs" / "current"
    cur.mkdir(parents=True)
    for d in ("bin", "lib"):
        os.symlink(os.path.join(VENV, d), cur / d)
    shutil.copy(os.path.join(VENV, "pyvenv.cfg"), cur / "pyvenv.cfg")
    (cur / "fingerprint.json").write_text(json.dumps(
        {"profile": "cpu", "python": "3.11", "torch": "2.13.0+cpu", "cuda_available": False,
         "device_count": 0, "devices": []}))
    (tmp_path / "data.jsonl").write_text("{}\n")
    (tmp_path / "target").mkdir()
    cfg = tmp_path / "r.yaml"
    cfg.write_text(f"model: {{target_path: {tmp_path / 'target'}}}\n"
                   f"data: {{path: {tmp_path / 'data.jsonl'}}}\ncompile: {{enabled: false}}\n")
    return root, hosts_yaml(tmp_path / "hosts.yaml", root), cfg


@pytest.mark.parametrize("dry", [True, False])
def test_a_gpu_device_on_a_host_without_one_is_refused_when_planned(env, capsys, dry):
    root, hosts, cfg = env
    args = ["launch", "--config", str(cfg), "--no-env-check",
            "--set", "parallel.drafter_devices=[cuda:0]"] + (["--dry-run"] if dry else [])
    rc, _, err = dfo(capsys, hosts, *args)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "parallel.drafter_devices" in err and "cuda:0 needs a GPU" in err
    assert "--set parallel.drafter_devices=[cpu]" in err
    assert not (root / "runs").exists() or not list((root / "runs").iterdir())
    rc, _, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--no-env-check",
                     "--dry-run", "--set", "parallel.drafter_devices=[cpu]")
    assert rc == 0, err


def test_the_refusal_to_reuse_a_run_name_names_the_newest_checkpoint(env, capsys):
    root, hosts, cfg = env
    for s in (80, 160, 180, 200):
        d = root / "checkpoints" / "r" / f"step_{s}"
        d.mkdir(parents=True)
        (d / "w.bin").write_bytes(b"w")
        write_manifest(str(d), s, ["w.bin"])
    rc, _, err = dfo(capsys, hosts, "launch", "--config", str(cfg), "--no-env-check",
                     "--dry-run")
    assert rc == 2 and "already holds 4 checkpoint(s)" in err and "(newest step_200)" in err


def test_device_check_units():
    fp = EnvFingerprint(cuda_available=True, device_count=2)
    check_devices({"parallel.drafter_devices": ["cuda:1"]}, fp, host="h", source="c")
    check_devices({"parallel.drafter_devices": ["cuda:0"]}, None, host="h", source="c")
    with pytest.raises(ConfigError, match=r"cuda:2, and the deployed env on h sees 2 GPU"):
        check_devices({"parallel.target_devices": ["cuda:0", "cuda:2"]}, fp, host="h",
                      source="c")
    with pytest.raises(ConfigError, match="cuda needs a GPU"):
        check_devices({"parallel.drafter_devices": ["cuda"]}, EnvFingerprint(cuda_available=False),
                      host="h", source="c")
