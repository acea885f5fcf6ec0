"""AOT-autograd caches the drafter step's kind of graph (no ``autograd_cache_bypass`` on
any start). Real torch on CPU: a function with an ``autocast(enabled=False)`` region
and a custom ``autograd.Function`` (what RoPE and the chunked CE put into the drafter
step), compiled through a ``trainer.compile.registry.CompileRegistry`` in a worker thread, in
two fresh processes sharing one cache dir: the first misses (and stores), the second HITS; neither bypasses.
Without ``trainer.compile.settings.CacheSettings.apply`` both bypass."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.toy_step import TOY_STEP_SRC
from tests.helpers.trainer import REPO

pytestmark = pytest.mark.timeout(600)

SCRIPT = r'''
import json, threading, torch
from trainer.compile.registry import CompileRegistry
from trainer.compile.gate import BypassReasons, counters_snapshot

''' + TOY_STEP_SRC + r'''

C = CompileRegistry()
out = {}
def run():  # a worker thread, as in the threads layout (config is per-thread on torch >= 2.12)
    x = torch.randn(8, 16)
    w = torch.randn(16, 16, requires_grad=True)
    with BypassReasons() as b:
        C.call("toy_step", step, x, w).backward()
    out["reasons"] = b.reasons
th = threading.Thread(target=run); th.start(); th.join()
out["counters"] = counters_snapshot()
print("RESULT " + json.dumps(out))
'''


def _run(cache: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=500)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_autocast_and_custom_function_graph_is_cached_across_processes(tmp_path):
    cache = str(tmp_path / "inductor")
    first = _run(cache)
    assert first["counters"]["autograd_cache_bypass"] == 0, first["reasons"]
    assert first["counters"]["autograd_cache_miss"] == 1
    second = _run(cache)
    assert second["counters"]["autograd_cache_bypass"] == 0, second["reasons"]
    assert second["counters"]["autograd_cache_hit"] == 1
    assert second["counters"]["fxgraph_cache_miss"] == 0
