"""Shared helpers for the trainer tests (tiny target, synthetic data, configs)."""

from __future__ import annotations

import os
import subprocess
import sys

from dfo_contract.markers import iter_markers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable


def make_target(path: str, layers: int = 4) -> str:
    from trainer.model.target import make_tiny_target

    return make_tiny_target(path, layers=layers)


def make_synth(path: str, num: int = 64, seq_len: int = 64, seed: int = 0) -> str:
    from trainer.data.synth import write_synth

    return write_synth(path, num=num, seq_len=seq_len, vocab=128, seed=seed)


def tiny_overrides(target: str, data: str, run_dir: str, **extra) -> list[str]:
    base = {
        "model.target_path": target, "model.drafter_layers": 1, "model.block_size": 8,
        "model.attention": "sdpa", "data.path": data, "data.max_seq_len": 64,
        "data.num_anchors": 8, "train.micro_batch": 8, "train.max_steps": 6, "train.lr": 3e-3,
        "train.log_every": 1, "compile.enabled": "false", "compile.gate": "false",
        "run.dir": run_dir, "parallel.target_devices": "[cpu]", "parallel.drafter_devices": "[cpu]",
    }
    base.update(extra)
    out = []
    for k, v in base.items():
        out += [f"--{k}", str(v)]
    return out


def tiny_config(target: str, data: str, run_dir: str, **extra):
    from dfo_contract.trainer_config import load_config

    return load_config(None, tiny_overrides(target, data, run_dir, **extra))


def run_trainer(args: list[str], env: dict | None = None, timeout: int = 120):
    e = dict(os.environ)
    e.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    e.pop("DFO_FAULT", None)
    if env:
        e.update(env)
    return subprocess.run([PY, "-m", "trainer", *args], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=timeout)


def markers(stdout: str) -> list[dict]:
    return list(iter_markers(stdout.splitlines()))


def trained_checkpoint(d, steps: int = 3) -> dict:
    """A tiny target (4 layers) and a 2-layer drafter trained ``steps`` steps on it, tapping
    [1, 2]: ``{"dir", "target", "ckpt", "cfg"}``."""
    import io

    from trainer.train.loop import train

    target = make_target(str(d / "target"))
    data = make_synth(str(d / "synth.jsonl"), num=24)
    cfg = tiny_config(target, data, str(d / "run"), **{"train.max_steps": steps,
                                                       "model.drafter_layers": 2,
                                                       "model.target_layer_ids": "[1,2]"})
    assert train(cfg, out=io.StringIO()) == 0
    return {"dir": d, "target": target, "data": data, "cfg": cfg,
            "ckpt": str(d / "run" / "checkpoints" / f"step_{steps}")}
