"""Unit tests for the compile-cache key (orchestrator.plan.cache_key): pure, no torch."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dfo_contract.env_fingerprint import EnvFingerprint
from orchestrator.plan import cache_key as ck

FP = {"profile": "cpu", "lock_hash": "a" * 64, "dfo": "0.1.0", "python": "3.11.2",
      "torch": "2.11.0+cu128", "torch_git": "70d99e998b4955e0049d13a98d77ae1b14db1f45",
      "torch_cuda": "12.8", "triton": "3.5.0", "cuda_available": True, "device_count": 2,
      "devices": [{"index": 0, "name": "NVIDIA H200", "capability": "9.0"},
                  {"index": 1, "name": "NVIDIA H200", "capability": "9.0"}],
      "transformers": "5.6.0", "trainer_import": True}

CFG = {"model": {"target_path": "/data/target", "drafter_layers": 5, "block_size": 16,
                 "attention": "flex", "mask_token_id": None, "init_seed": 3, "dtype": "auto"},
       "data": {"path": "/data/x.jsonl", "max_seq_len": 4096, "num_anchors": 512,
                "seq_buckets": [2048, 4096], "anchor_buckets": [512], "shuffle": True},
       "train": {"micro_batch": 1, "lr": 6e-4, "max_steps": 100, "seed": 0},
       "parallel": {"layout": "threads", "target_devices": ["cuda:0"], "drafter_devices": ["cuda:1"]},
       "compile": {"enabled": True, "gate": True},
       "run": {"dir": "/x"}}


def key(fp=FP, cfg=CFG, src="s" * 64, target="t" * 64):
    return ck.compute_key(EnvFingerprint.from_json(fp), cfg, trainer_source=src, target_config=target)


def test_compile_gate_is_not_in_the_key():
    """Gate on or off compiles the same artifacts: one snapshot serves both."""
    off = dict(CFG, compile={"enabled": True, "gate": False})
    assert key(cfg=off).key == key().key
    assert "config.compile.gate" not in key().components
    assert key(cfg=dict(CFG, compile={"enabled": False, "gate": True})).key != key().key


def test_key_is_stable_and_filesystem_safe():
    a, b = key(), key()
    assert a.key == b.key
    assert a.key.startswith("cpu-") and len(a.key) == 4 + 16
    assert all(c.isalnum() or c in "-_." for c in a.key)


def test_dfo_version_is_not_in_the_key():
    other = dict(FP, dfo="9.9.9")
    assert key(other).key == key().key
    assert "dfo" not in key().components


@pytest.mark.parametrize("field,value,component", [
    ("torch_cuda", "13.0", "torch.version.cuda"),
    ("torch", "2.11.0+cu130", "torch.__version__"),
    ("triton", "3.6.0", "triton"),
    ("lock_hash", "b" * 64, "lock_hash"),
    ("python", "3.12.1", "python"),
])
def test_each_fingerprint_field_changes_the_key_and_is_named(field, value, component):
    other = key(dict(FP, **{field: value}))
    assert other.key != key().key
    diffs = ck.diff_components(key().components, other.components)
    assert [d[0] for d in diffs] == [component]


def test_cuda_mismatch_message_reads_like_the_issue():
    snap = key(dict(FP, torch_cuda="12.8"))
    env = key(dict(FP, torch_cuda="13.0"))
    msg = ck.explain_diff(ck.diff_components(snap.components, env.components))
    assert msg == "torch.version.cuda: snapshot 12.8, env 13.0"


def test_gpu_name_of_the_drafter_device_is_in_the_key():
    h100 = dict(FP, devices=[{"index": 0, "name": "NVIDIA H200", "capability": "9.0"},
                             {"index": 1, "name": "NVIDIA H100", "capability": "9.0"}])
    a, b = key(), key(h100)
    assert a.components["gpu"] == "cuda:1=NVIDIA H200 (9.0)"
    assert b.components["gpu"] == "cuda:1=NVIDIA H100 (9.0)"
    names = [d[0] for d in ck.diff_components(a.components, b.components)]
    assert "gpu" in names and "devices" in names


@pytest.mark.parametrize("path,value", [
    ("model.attention", "sdpa"), ("model.block_size", 8), ("data.seq_buckets", [4096]),
    ("data.anchor_buckets", [256, 512]), ("train.micro_batch", 2),
    ("parallel.drafter_devices", ["cuda:0"]), ("compile.enabled", False),
])
def test_compile_relevant_config_changes_the_key(path, value):
    cfg = json.loads(json.dumps(CFG))
    sec, f = path.split(".")
    cfg[sec][f] = value
    other = key(cfg=cfg)
    assert other.key != key().key
    assert f"config.{path}" in [d[0] for d in ck.diff_components(key().components, other.components)]


@pytest.mark.parametrize("path,value", [
    ("model.target_path", "/elsewhere"), ("model.init_seed", 9), ("data.path", "/y.jsonl"),
    ("train.lr", 1e-3), ("train.max_steps", 5), ("run.dir", "/z"), ("data.shuffle", False),
])
def test_irrelevant_config_does_not_change_the_key(path, value):
    cfg = json.loads(json.dumps(CFG))
    sec, f = path.split(".")
    cfg[sec][f] = value
    assert key(cfg=cfg).key == key().key


def test_trainer_source_and_target_config_change_the_key():
    assert key(src="x" * 64).key != key().key
    assert key(target=None).key != key().key
    d = ck.diff_components(key().components, key(src="x" * 64).components)
    assert [n for n, _, _ in d] == ["trainer.source"]


def test_auto_devices_resolve_to_the_env():
    cfg = json.loads(json.dumps(CFG))
    cfg["parallel"]["drafter_devices"] = ["auto"]
    assert key(cfg=cfg).components["gpu"].startswith("cuda:0=NVIDIA H200")
    cpu = dict(FP, cuda_available=False, devices=[], device_count=0)
    assert key(cpu, cfg).components["gpu"] == "cpu"


def test_diff_marks_absent_components():
    d = ck.diff_components({"a": "1"}, {"a": "1", "b": "2"})
    assert d == [("b", "absent", "2")]
    assert ck.explain_diff(d) == "b: snapshot absent, env 2"


def test_source_hash_script_matches_pure_combiner(tmp_path: Path):
    pkg = tmp_path / "pkgx"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    (pkg / "sub" / "m.py").write_text("y = 2\n")
    (pkg / "notes.txt").write_text("ignored\n")
    out = subprocess.run([sys.executable, "-c", ck.SOURCE_HASH_SCRIPT, "pkgx"], cwd=tmp_path,
                         capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
    hashes = json.loads(out)
    assert set(hashes) == {"__init__.py", "sub/m.py"}
    assert hashes["sub/m.py"] == hashlib.sha256(b"y = 2\n").hexdigest()
    h1 = ck.source_hash(hashes)
    (pkg / "sub" / "m.py").write_text("y = 3\n")
    out2 = subprocess.run([sys.executable, "-c", ck.SOURCE_HASH_SCRIPT, "pkgx"], cwd=tmp_path,
                          capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
    assert ck.source_hash(json.loads(out2)) != h1


def test_source_hash_script_reports_missing_package(tmp_path: Path):
    r = subprocess.run([sys.executable, "-c", ck.SOURCE_HASH_SCRIPT, "no_such_pkg_dfo"],
                       capture_output=True, text=True)
    assert r.returncode == 3 and "error" in json.loads(r.stdout)


@pytest.mark.parametrize("sets", [{}, {"model.method": "dflash2", "data.pack": True,
                                       "parallel.drafter_devices": ["cuda:1"]}])
def test_a_typed_config_has_the_key_of_its_nested_dict(sets):
    """The key of a ``TrainerConfig`` is the key of its ``to_dict``: the same bytes."""
    from dfo_contract import trainer_config as tcfg

    cfg = tcfg.set_values(tcfg.config_from_dict(json.loads(json.dumps(CFG))), sets)
    typed, nested = key(cfg=cfg), key(cfg=cfg.to_dict())
    assert typed.components == nested.components and typed.key == nested.key
