"""A deployed-looking env root for the cache tests: envs/current whose python runs this
venv with a frozen copy of the trainer, and a small real torch.compile to fill caches."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dfo_contract.env_fingerprint import EnvFingerprint
from dfo_contract.trainer_config import TrainerConfig, config_from_dict
from orchestrator.plan.fingerprint import PROBE_SCRIPT, build_fingerprint, fingerprint_json, parse_probe

# A small real compile (fwd + bwd) whose cache counters we read, like the trainer's warm-up.
COMPILE = r"""
import json, torch
from torch._dynamo.utils import counters
def f(x, w):
    return torch.nn.functional.gelu(x @ w).sum()
x = torch.randn(8, 16, requires_grad=True); w = torch.randn(16, 16, requires_grad=True)
torch.compile(f)(x, w).backward()
print(json.dumps({"fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
                  "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
                  "autograd_cache_hit": counters["aot_autograd"]["autograd_cache_hit"],
                  "autograd_cache_miss": counters["aot_autograd"]["autograd_cache_miss"]}))
"""

REPO = Path(__file__).resolve().parents[2]

CFG = {"model": {"attention": "sdpa", "block_size": 4}, "data": {"seq_buckets": [32]},
       "parallel": {"drafter_devices": ["cpu"]}, "compile": {"enabled": True}}


def typed(cfg: dict = CFG) -> TrainerConfig:
    """The trainer config a nested dict like ``CFG`` sets (what ``CacheManager.key`` takes)."""
    return config_from_dict(json.loads(json.dumps(cfg)))


_FROZEN: list[Path] = []


def frozen_trainer() -> Path:
    """One copy of the trainer package per test session, so that every env made by
    make_env has the same trainer.source even while the working tree is being edited."""
    if not _FROZEN:
        d = Path(tempfile.mkdtemp(prefix="dfo-cache-trainer-")) / "trainer"
        shutil.copytree(REPO / "trainer", d, ignore=shutil.ignore_patterns("__pycache__"))
        _FROZEN.append(d)
        atexit.register(shutil.rmtree, d.parent, True)
    return _FROZEN[0]


def make_env(root: Path, **fp_changes) -> None:
    """envs/cpu-test with bin/python -> this interpreter, fingerprint from the real probe."""
    env = root / "envs" / "cpu-test"
    (env / "bin").mkdir(parents=True, exist_ok=True)
    # the env's own copy of the trainer (as a deployed wheel would be): edits to the
    # working tree after this point do not change the env's trainer.source
    lib = env / "lib"
    if not (lib / "trainer").is_dir():
        shutil.copytree(frozen_trainer(), lib / "trainer")
    py = env / "bin" / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={lib}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    out = subprocess.run([str(py), "-c", PROBE_SCRIPT], capture_output=True, text=True, check=True).stdout
    fp = build_fingerprint(parse_probe(out), profile="cpu", lock_hash="0" * 64)
    fp = EnvFingerprint.from_json({**fp.to_json(), **fp_changes})
    (env / "fingerprint.json").write_bytes(fingerprint_json(fp))
    cur = root / "envs" / "current"
    if not cur.is_symlink():
        cur.symlink_to("cpu-test")


def compile_into(cache_dir: Path) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir / "inductor"),
               TRITON_CACHE_DIR=str(cache_dir / "triton"))
    r = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
