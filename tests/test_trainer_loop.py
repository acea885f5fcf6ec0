"""The single-device loop on CPU: metrics, exact resume, SIGTERM, checkpoints, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers.trainer import (PY, REPO, make_synth, make_target, markers, run_trainer,
                                        tiny_config, tiny_overrides)
from dfo_contract import checkpoints as cm
from dfo_contract.exitcodes import CheckpointError
from trainer.train.loop import train
from dfo_contract.metrics_record import TRAIN_FIELDS

#: every key of a training step's metrics.jsonl record
STEP_FIELDS = ("step", *TRAIN_FIELDS, "phase", "attempt")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("loop")
    return {"dir": d, "target": make_target(str(d / "target")),
            "data": make_synth(str(d / "synth.jsonl"), num=48)}


# one torch thread: the same as the subprocess runs (OMP_NUM_THREADS=1)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _losses(run_dir) -> dict[int, float]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def _train(env, run, **kw):
    import io

    out = io.StringIO()
    cfg = tiny_config(env["target"], env["data"], str(env["dir"] / run), **kw)
    code = train(cfg, out=out)
    return code, out.getvalue()


def test_metrics_file_fields_and_markers(env, monkeypatch):
    monkeypatch.setenv("DFO_ATTEMPT", "3")
    code, out = _train(env, "m", **{"train.max_steps": 3, "checkpoint.every": 0})
    assert code == 0
    with open(env["dir"] / "m" / "metrics.jsonl") as f:
        recs = [json.loads(line) for line in f]
    assert [r["step"] for r in recs] == [1, 2, 3]
    for r in recs:
        assert set(STEP_FIELDS) <= set(r)
        assert r["attempt"] == 3 and r["phase"] == "train" and r["tokens_per_s"] > 0
        assert 0 <= r["acc"] <= 1 and r["tau"] >= 1 and r["peak_mem_bytes"] > 0
    ms = markers(out)
    kinds = [m["kind"] for m in ms]
    assert kinds[0] == "phase" and kinds[-1] == "done" and "checkpoint" in kinds
    assert [m["step"] for m in ms if m["kind"] == "step"] == [1, 2, 3]
    assert cm.verify(str(env["dir"] / "m" / "checkpoints" / "step_3"))[0]


def test_exact_resume_bit_identical(env):
    common = {"train.schedule_steps": 8, "checkpoint.every": 0}
    assert _train(env, "full", **common, **{"train.max_steps": 8})[0] == 0
    full = _losses(env["dir"] / "full")
    # stopped at step 4 (final checkpoint step_4), then resumed to 8 in the same run dir
    assert _train(env, "part", **common, **{"train.max_steps": 4})[0] == 0
    cfg = tiny_config(env["target"], env["data"], str(env["dir"] / "part"), **common,
                      **{"train.max_steps": 8})
    assert train(cfg, resume="latest", out=open(os.devnull, "w")) == 0
    part = _losses(env["dir"] / "part")
    assert sorted(part) == list(range(1, 9))
    for s in range(1, 9):
        assert part[s] == full[s], (s, part[s], full[s])  # bit-identical, not approx


def test_sigterm_saves_and_exits_6_then_resumes_exactly(env):
    run = env["dir"] / "sig"
    args = ["train", *tiny_overrides(env["target"], env["data"], str(run),
                                     **{"train.max_steps": 100000, "train.schedule_steps": 60,
                                        "checkpoint.every": 0})]
    e = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    e.pop("DFO_FAULT", None)
    p = subprocess.Popen([PY, "-m", "trainer", *args], cwd=REPO, env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    seen = []
    deadline = time.time() + 90
    for line in p.stdout:
        if line.startswith("@dfo "):
            seen.append(json.loads(line[5:]))
            if seen[-1]["kind"] == "step" and seen[-1]["step"] >= 3:
                p.send_signal(signal.SIGTERM)
                break
        assert time.time() < deadline, "no step within 90 s"
    rest, err = p.communicate(timeout=60)
    assert p.returncode == 6, err
    seen += markers(rest)
    ck = [m for m in seen if m["kind"] == "checkpoint"]
    assert len(ck) == 1
    k = ck[0]["step"]
    assert 3 <= k < 55 and cm.verify(ck[0]["path"])[0]
    # resume from latest for 3 more steps == the uninterrupted run's steps k+1..k+3
    cfg = tiny_config(env["target"], env["data"], str(run), **{"train.max_steps": k + 3,
                                                              "train.schedule_steps": 60,
                                                              "checkpoint.every": 0})
    assert train(cfg, resume="latest", out=open(os.devnull, "w")) == 0
    got = _losses(run)
    assert _train(env, "sigref", **{"train.max_steps": k + 3, "train.schedule_steps": 60,
                                   "checkpoint.every": 0})[0] == 0
    ref = _losses(env["dir"] / "sigref")
    for s in range(1, k + 4):
        assert got[s] == ref[s], (s, k)


def test_corrupt_and_torn_checkpoints_are_skipped(env, caplog):
    run = env["dir"] / "ck"
    assert _train(env, "ck", **{"train.max_steps": 4, "checkpoint.every": 1,
                                "checkpoint.keep": 10})[0] == 0
    root = str(run / "checkpoints")
    assert [c.step for c in cm.list_checkpoints(root)] == [4, 3, 2, 1]
    # step_4: corrupt weights (same size); step_3: torn (no manifest); a temp dir of a dead pid
    p4 = os.path.join(root, "step_4", "drafter.safetensors")
    data = bytearray(open(p4, "rb").read())
    data[-5] ^= 0xFF
    open(p4, "wb").write(bytes(data))
    os.remove(os.path.join(root, "step_3", "manifest.json"))
    os.makedirs(os.path.join(root, ".step_5.tmp-999999"))
    infos = {c.name: c for c in cm.list_checkpoints(root)}
    assert "sha256 mismatch" in infos["step_4"].reason and "torn" in infos["step_3"].reason
    assert ".step_5.tmp-999999" not in infos
    with caplog.at_level("WARNING", logger="dfo"):
        assert cm.resolve(root, "latest").endswith("step_2")
    assert "step_4" in caplog.text and "step_3" in caplog.text
    with pytest.raises(CheckpointError, match="step_4.*sha256"):
        cm.resolve(root, "step_4")
    with pytest.raises(CheckpointError, match="does not exist"):
        cm.resolve(root, "step_9")
    assert cm.resolve("/elsewhere", os.path.join(root, "step_2")) == os.path.join(root, "step_2")
    with pytest.raises(CheckpointError, match="torn"):
        cm.resolve("/elsewhere", os.path.join(root, "step_3"))
    # the CLI list is torch-free and reports the reasons
    code = ("import sys, json, io, contextlib; from trainer.core.checkpoints import main; "
            "buf = io.StringIO(); ctx = contextlib.redirect_stdout(buf); ctx.__enter__(); "
            f"main(['list', {root!r}, '--json']); ctx.__exit__(None, None, None); "
            "assert 'torch' not in sys.modules; print(buf.getvalue())")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    listing = json.loads(out)
    assert listing["latest"] == "step_2"
    assert [c["valid"] for c in listing["checkpoints"]] == [False, False, True, True]
    # resuming from latest trains on from step 2
    cfg = tiny_config(env["target"], env["data"], str(run), **{"train.max_steps": 3,
                                                              "checkpoint.every": 0,
                                                              "checkpoint.keep": 10})
    assert train(cfg, resume="latest", out=open(os.devnull, "w")) == 0
    assert cm.verify(os.path.join(root, "step_3"))[0]


def test_keep_last_k(env):
    assert _train(env, "keep", **{"train.max_steps": 5, "checkpoint.every": 1,
                                  "checkpoint.keep": 2})[0] == 0
    names = sorted(os.listdir(env["dir"] / "keep" / "checkpoints"))
    assert names == ["step_4", "step_5"]


def test_cli_exit_codes(env, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [5, 6], "loss_mask": [1, 1]}\n{"input_ids": [5, 999], "loss_mask": [1, 1]}\n')
    r = run_trainer(["train", *tiny_overrides(env["target"], str(bad), str(tmp_path / "r"))])
    assert r.returncode == 3, r.stderr
    assert f"{bad}:2" in r.stderr and "999 >= the target's vocab size 128" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_trainer(["train", *tiny_overrides(env["target"], env["data"], str(tmp_path / "r"),
                                              **{"train.micro_batch": 0})])
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "config: --train.micro_batch: expected a positive integer, got 0")
    r = run_trainer(["train", *tiny_overrides(env["target"], env["data"], str(tmp_path / "r2")),
                     "--resume", "step_7"])
    assert r.returncode == 4 and "step_7" in r.stderr and "Traceback" not in r.stderr


def test_fault_hook_nan_stops_with_nan_loss(env):
    from dfo_contract.exitcodes import NonFiniteLoss

    with pytest.raises(NonFiniteLoss, match="loss is nan at step 2"):
        _train(env, "nan", **{"train.max_steps": 4, "fault.spec": "nan@2#*"})
    with open(env["dir"] / "nan" / "metrics.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [1]


def test_short_run_loss_falls(env):
    assert _train(env, "fall", **{"train.max_steps": 60, "train.lr": 1e-2, "train.log_every": 10,
                                  "checkpoint.every": 0, "checkpoint.save_final": "false",
                                  "model.drafter_layers": 2, "model.target_layer_ids": "[1,2]"})[0] == 0
    losses = _losses(env["dir"] / "fall")
    assert sorted(losses) == [10, 20, 30, 40, 50, 60]
    assert losses[60] < losses[10] - 0.3, losses
    assert not (env["dir"] / "fall" / "checkpoints").exists()


def test_checkpoints_record_lineage_and_prune_spares_another_runs(env, monkeypatch):
    """DFO_RUN_ID/DFO_ATTEMPT reach the manifest; keep=1 prunes only this run's checkpoints."""
    ck = env["dir"] / "lin" / "checkpoints"
    other = ck / "step_262"
    other.mkdir(parents=True)
    for name in cm.REQUIRED_FILES:
        (other / name).write_text(name)
    cm.write_manifest(str(other), 262, list(cm.REQUIRED_FILES),
                      lineage={"run": "old-run", "attempt": 1})
    sha = cm.read_manifest(str(other))["files"]
    monkeypatch.setenv("DFO_RUN_ID", "new-run")
    monkeypatch.setenv("DFO_ATTEMPT", "2")
    code, _ = _train(env, "lin", **{"train.max_steps": 4, "checkpoint.every": 2,
                                    "checkpoint.keep": 1})
    assert code == 0
    assert sorted(os.listdir(ck)) == ["step_262", "step_4"]
    assert cm.read_manifest(str(ck / "step_4"))["lineage"] == {"run": "new-run", "attempt": 2}
    assert cm.read_manifest(str(other))["files"] == sha and cm.verify(str(other))[0]


def test_startup_breakdown_marker_counts_from_the_supervisors_spawn(env, monkeypatch):
    """The loop reports where its start went: the spawn phase counts from $DFO_SPAWN_T."""
    monkeypatch.setenv("DFO_SPAWN_T", f"{time.time() - 30:.3f}")
    code, out = _train(env, "st", **{"train.max_steps": 1, "checkpoint.every": 0})
    assert code == 0
    (rec,) = [m for m in markers(out) if m["kind"] == "startup"]
    ph = rec["phases"]
    assert list(ph)[:3] == ["spawn", "layout", "data"]
    assert 30 <= ph["spawn"] < 300 and ph["layout"] > 0
    assert abs(rec["total_s"] - sum(ph.values())) < 0.01
    line = [x for x in out.splitlines() if x.startswith("startup: ")]
    assert len(line) == 1 and "spawn 3" in line[0] and "layout " in line[0]


def test_startup_without_spawn_time_counts_from_process_start(monkeypatch):
    from trainer.env import process_start_t
    from trainer.telemetry import metrics

    t = process_start_t()
    assert t is not None and 0 < time.time() - t < 24 * 3600
    s = metrics.Startup(None)
    s.mark("layout")
    assert [n for n, _ in s.phases] == ["layout"]
    s2 = metrics.Startup(time.time() + 60)  # a clock in the future is not counted
    assert s2.phases == []
