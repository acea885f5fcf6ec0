"""``python -m trainer warmup``: real inductor compiles, cache counters, mega-cache round trip."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytest.importorskip("torch")

from tests.helpers.trainer import PY, REPO, make_synth, make_target, markers, \
    run_trainer, tiny_overrides  # noqa: E402
from dfo_contract.exitcodes import TrainerConfigError  # noqa: E402
from trainer.train.compile_only import parse_args, warm_devices  # noqa: E402


def test_parse_args_splits_own_flags_from_overrides():
    own, rest = parse_args(["--config", "a.yaml", "--report=r.json", "--train.micro_batch", "4",
                            "--save-mega-cache", "m.bin"])
    assert own["--config"] == "a.yaml" and own["--report"] == "r.json"
    assert own["--save-mega-cache"] == "m.bin" and own["--load-mega-cache"] is None
    assert rest == ["--train.micro_batch", "4"]
    own, rest = parse_args(["--report", "r.json", "--data.path", "d"])  # config file optional
    assert own["--config"] is None and rest == ["--data.path", "d"]
    with pytest.raises(TrainerConfigError, match="--report: missing value"):
        parse_args(["--config", "a.yaml", "--report"])


def test_warm_devices_per_layout():
    from dfo_contract.trainer_config import load_config

    cfg = load_config(None, ["--data.path", "x", "--parallel.layout", "threads",
                             "--parallel.target_devices", "[cpu]",
                             "--parallel.drafter_devices", "[cpu,cpu,cpu]"])
    assert warm_devices(cfg) == ["cpu"]


# set in os.environ by torch when this pytest process compiled something in-process
_TORCH_SET = ("TORCH_WARM_POOL", "KMP_DUPLICATE_LIB_OK", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
              "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "DFO_FAULT")


def _run_clean(args, cache_dir):
    """The trainer in a subprocess with an environment free of torch's in-process settings."""
    env = {k: v for k, v in os.environ.items() if k not in _TORCH_SET}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TORCHINDUCTOR_CACHE_DIR=cache_dir)
    return subprocess.run([PY, "-m", "trainer", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("warmup")
    return make_target(str(d / "target")), make_synth(str(d / "data.jsonl"), num=16), d


def _args(tiny, tmp_path, *extra):
    target, data, _ = tiny
    ov = tiny_overrides(target, data, str(tmp_path / "run"), **{
        "compile.enabled": "true", "compile.gate": "true", "train.micro_batch": 2,
        "train.heartbeat_s": 1})
    return ["warmup", *ov, *extra]


def test_config_errors_exit_2_one_line(tiny, tmp_path):
    r = run_trainer(["warmup", "--config", str(tmp_path / "missing.yaml")])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "does not exist" in r.stderr
    r = run_trainer(_args(tiny, tmp_path, "--load-mega-cache", str(tmp_path / "nope.bin")))
    assert r.returncode == 2 and "--load-mega-cache: file" in r.stderr


def test_cold_then_mega_cache_into_an_empty_cache_hits(tiny, tmp_path):
    report1, mega = tmp_path / "r1.json", tmp_path / "mega.bin"
    r = _run_clean(_args(tiny, tmp_path, "--report", str(report1), "--save-mega-cache", str(mega)),
                   str(tmp_path / "cache1"))
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(report1.read_text())
    assert rep["devices"] == ["cpu"] and rep["buckets"] == [[64, 8]]
    (rec,) = rep["records"]
    assert rec["device"] == "cpu" and rec["shape"] == [64, 8] and rec["seconds"] > 0
    assert rec["counters"]["fxgraph_cache_miss"] >= 1 and rec["counters"]["fxgraph_cache_hit"] == 0
    assert rep["mega_cache_save"]["bytes"] > 0 and mega.stat().st_size > 0
    ms = markers(r.stdout)
    assert ms[0] == {**ms[0], "kind": "phase", "phase": "warmup"}
    assert any(m["kind"] == "heartbeat" and m["phase"] == "warmup" for m in ms)
    assert ms[-1]["kind"] == "done"
    assert "warmup: cpu (seq_len=64, anchors=8)" in r.stdout
    # the per-phase breakdown: a cold start compiles (inductor) and traces (dynamo)
    ph = rec["phases"]
    assert ph["dynamo"] > 0 and ph["inductor_compile"] > 0 and ph["dynamo_trace"] > 0, ph
    assert rep["build_models_s"]["cpu"] > 0 and rep["phases"]["dynamo"] == ph["dynamo"]
    assert "compile phases (all shapes): dynamo" in r.stdout and "warmup: build_models" in r.stdout

    report2 = tmp_path / "r2.json"
    r2 = _run_clean(_args(tiny, tmp_path, "--report", str(report2), "--load-mega-cache", str(mega)),
                    str(tmp_path / "cache2"))
    assert r2.returncode == 0, r2.stderr[-3000:]
    rep2 = json.loads(report2.read_text())
    c = rep2["records"][0]["counters"]
    assert c["fxgraph_cache_hit"] >= 1 and c["fxgraph_cache_miss"] == 0, c
    assert rep2["records"][0]["phases"]["inductor_compile"] == 0  # loaded, not compiled
    assert rep2["mega_cache_load"]["bytes"] == mega.stat().st_size
