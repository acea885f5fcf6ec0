"""``dfo export`` through the real CLI on the local transport: a real run's checkpoints (the
trainer on CPU, with the measured acceptance length as eval), exported by the env's python
on the host, copied here and sha256-verified."""

from __future__ import annotations

import io
import json
import os

import pytest

from dfo_contract.fsio import atomic_write_json, sha256_file
from orchestrator.cli import main
from orchestrator.ops import runstate as rs
from tests.helpers.trainer import make_synth, make_target, tiny_config
from tests.supervisor_env import hosts_yaml, make_root


@pytest.fixture(scope="module")
def host_run(tmp_path_factory):
    from trainer.train.loop import train

    tmp = tmp_path_factory.mktemp("xport")
    root = make_root(tmp)
    hosts = hosts_yaml(tmp / "hosts.yaml", root)
    target = make_target(str(tmp / "target"))
    data = make_synth(str(tmp / "synth.jsonl"), num=24)
    run_id, name = "20260101-000000-tiny", "tiny"
    run_dir = root / "runs" / run_id
    run_dir.mkdir(parents=True)
    atomic_write_json(run_dir / rs.STATE_FILE, rs.new_state(run_id, name, now=1.0))
    cfg = tiny_config(target, data, str(run_dir), **{
        "train.max_steps": 4, "checkpoint.dir": str(root / "checkpoints" / name),
        "checkpoint.every": 2, "data.eval_path": data, "eval.every": 2, "eval.max_samples": 8})
    assert train(cfg, out=io.StringIO()) == 0
    return {"root": root, "hosts": hosts, "tmp": tmp, "run_id": run_id}


def dfo(capsys, hosts, *args):
    rc = main(["--hosts", str(hosts), *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_export_best_to_local_dir(host_run, capsys):
    best = json.loads((host_run["root"] / "checkpoints" / "tiny" / "best").read_text())
    to = host_run["tmp"] / "mine" / "drafter"
    rc, out, err = dfo(capsys, host_run["hosts"], "export", "--step", "best", "--to", str(to), "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["step"] == best["step"] and res["accept_len"] == pytest.approx(best["accept_len"])
    assert sorted(os.listdir(to)) == ["README.md", "config.json", "dfo_export.json",
                                      "model.safetensors", "modeling_dflash.py"]
    for name, meta in res["files"].items():
        assert sha256_file(to / name) == meta["sha256"]
    assert sorted(os.listdir(to.parent)) == ["drafter"]          # no temp dir left behind
    assert res["remote_dir"].startswith(str(host_run["root"] / "exports" / "tiny"))
    # progress lines (human mode), and a re-export replaces the directory
    rc, out, err = dfo(capsys, host_run["hosts"], "export", "--step", "4", "--to", str(to))
    assert rc == 0 and "model.safetensors verified" in err and "exported step 4" in out


def test_export_user_errors_are_one_line(host_run, capsys):
    to = host_run["tmp"] / "x"
    rc, _, err = dfo(capsys, host_run["hosts"], "export", "--step", "soon", "--to", str(to))
    assert rc == 2 and err.startswith("dfo: error: --step") and err.count("\n") == 1
    rc, _, err = dfo(capsys, host_run["hosts"], "export", "--step", "99", "--to", str(to))
    assert rc != 0 and err.startswith("dfo: error:") and err.count("\n") == 1
    assert not to.exists()
