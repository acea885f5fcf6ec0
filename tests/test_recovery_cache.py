"""A retry after a failure hits the compile cache the failed attempt built.

Real torch on CPU, a tiny model, the drafter step compiled: attempt 1 (gate off, as in the
threaded lazy-compile race, docs/recovery.md) compiles and then fails through an injected
fault; the supervisor's ``compile_gate`` step re-seeds the run's cache (``restore_cache``:
the seed script run again, exactly as ``Supervisor.restore_cache`` runs it); attempt 2
(gate on) must HIT every FX graph and the AOT-autograd entry attempt 1 compiled. A re-seed
that replaced the run's cache with the (here empty) live cache would give fxgraph 0 hits,
and an AOT-autograd cache that bypassed the drafter step's graph would miss on every start.
Assertions are on torch's cache counters (the trainer's ``warmup:`` lines), never on time.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from orchestrator.plan import snapshot as sn
from orchestrator.config.host_tree import HostTree
from tests.helpers.trainer import make_synth, make_target, run_trainer, tiny_overrides

pytestmark = pytest.mark.timeout(900)

WARM = re.compile(r"warmup: (\S+) .* fxgraph hit (\d+) miss (\d+)\s+autograd hit (\d+) miss (\d+)"
                  r"(?: bypass (\d+))?")


def _warm_lines(out: str) -> list[tuple[int, ...]]:
    return [tuple(int(g or 0) for g in m.groups()[1:]) for m in WARM.finditer(out)]


def test_retry_after_fault_hits_what_attempt_1_compiled(tmp_path: Path):
    target = make_target(str(tmp_path / "target"))
    data = make_synth(str(tmp_path / "data.jsonl"))
    tree = HostTree(str(tmp_path / "root"))
    run_dir = tmp_path / "root" / "runs" / "r1"
    seed = sn.seed_run_cache_argvs(tree, "k", str(run_dir))   # no live cache: a cold run
    for argv in seed:
        subprocess.run(argv, check=True)
    env = dict(sn.cache_env(tree, "k", str(run_dir)), DFO_RUN_DIR=str(run_dir))
    args = ["train", *tiny_overrides(target, data, str(run_dir / "out"),
                                     **{"compile.enabled": "true", "train.max_steps": 4,
                                        "checkpoint.every": 100})]
    r1 = run_trainer(args + ["--compile.gate", "false"], timeout=600,
                     env=dict(env, DFO_ATTEMPT="1", DFO_FAULT="exit=5@2"))
    assert r1.returncode == 5, (r1.stdout + r1.stderr)[-3000:]
    assert any(f.name.endswith(".py") or f.is_file()
               for f in (run_dir / "cache" / "inductor").rglob("*")), "attempt 1 compiled nothing"
    # the supervisor's restore before the compile_gate retry
    subprocess.run(seed[-1], check=True)
    r2 = run_trainer(args + ["--compile.gate", "true"], timeout=600, env=dict(env, DFO_ATTEMPT="2"))
    assert r2.returncode == 0, (r2.stdout + r2.stderr)[-3000:]
    lines = _warm_lines(r2.stdout)
    assert lines, r2.stdout[-2000:]
    fx_hit = sum(x[0] for x in lines)
    fx_miss = sum(x[1] for x in lines)
    ag_hit, ag_miss, ag_bypass = (sum(x[i] for x in lines) for i in (2, 3, 4))
    assert fx_hit > 0 and fx_miss == 0, r2.stdout[-2000:]
    assert ag_hit >= 1 and ag_miss == 0 and ag_bypass == 0, r2.stdout[-2000:]
