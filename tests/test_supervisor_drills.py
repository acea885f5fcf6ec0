"""Issue 17's fault-drill findings, replayed with the real trainer on CPU under the real
supervisor (local transport):

- a busy host (a CPU hog beside the run) drops tokens/s: recorded as ``throughput_low``
  with what the host showed; no SIGTERM, no fallback, no config change;
- a hang is acted on within ``hang_s`` of the heartbeats stopping, not after ``train_s``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.transport.local import LocalTransport

from tests.supervisor_env import (FAST, events, local_host, make_root,  # noqa: F401
                                  wait_final, wait_for, write_config)

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path, tiny_assets):  # noqa: F811
    root = make_root(tmp_path)
    ops = RunOps(LocalTransport("local"), local_host(root))
    return root, ops, tmp_path


def launch(ops, cfg, *, fault=None, name="t", **kw):
    o = LaunchOptions(config=str(cfg), run_name=name, fault=fault, backoff_scale=0.01,
                      thresholds=dict(FAST, **kw.pop("thresholds", {})), env_check=False, **kw)
    return ops.launch(o)


def kinds(evs, kind):
    return [e for e in evs if e["kind"] == kind]


def state(root, run_id) -> dict:
    try:
        return json.loads((root / "runs" / run_id / "state.json").read_text())
    except (OSError, ValueError):
        return {}


HOG = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end:\n    pass\n"


def test_a_cpu_hog_is_host_busy_not_dense_attention(setup, tiny_assets):  # noqa: F811
    root, ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets, train={"max_steps": 100000},
                       checkpoint={"every": 50})
    plan = launch(ops, cfg, thresholds={"train_s": 120, "collapse_steps": 12,
                                        "baseline_steps": 3, "skip_steps": 2})
    hogs: list[subprocess.Popen] = []
    try:
        wait_for(lambda: state(root, plan.run_id).get("baseline_tokens_per_s"), 180,
                 "a throughput baseline")
        n = 4 * (os.cpu_count() or 1) + 2
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]
        low = wait_for(lambda: kinds(events(root, plan.run_id), "throughput_low"), 240,
                       "a throughput_low event")[0]
        time.sleep(3)   # the run goes on under the hog: nothing is stopped
        st = state(root, plan.run_id)
        assert st["status"] == "running" and st["attempt"] == 1
        # the latest judgement may differ from the first while the hog starts and the host
        # settles (seen on a loaded 2-core CI run: "unknown"); the first one is checked below
        assert st["throughput_low"] is None or st["throughput_low"]["cause"] in ("host_busy", "unknown")
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()
        ops.stop(plan.run_id)   # also when an assertion failed: never leave the run going
    info = wait_final(ops, plan.run_id)
    evs = events(root, plan.run_id)
    assert low["cause"] == "host_busy", low
    seen = low["seen"]     # what the host showed: other processes' cores, or the load
    assert (seen["other_cores"] >= 1.0 and "other processes kept" in low["summary"]) or \
        (seen["load1"] > seen["cores"] and "load" in low["summary"]), low
    assert low["seen"]["gpu_apps"] in ("unknown (no nvidia-smi)", []) or \
        isinstance(low["seen"]["gpu_apps"], list)
    # the config never changed and no attempt was cut short for it
    assert kinds(evs, "fallback") == [] and kinds(evs, "restart") == []
    assert [e["class"] for e in kinds(evs, "classified")] in ([], ["done"])
    assert len(kinds(evs, "attempt_start")) == 1
    assert info["overrides"] == {} and info["status"] == "stopped"
    assert not any("throughput collapse" in e.get("reason", "") for e in kinds(evs, "watchdog"))


def test_a_hang_is_acted_on_within_hang_s_of_the_last_heartbeat(setup, tiny_assets):  # noqa: F811
    root, ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    # train_s 300 (the default): before the fix, nothing happened for 5 minutes
    plan = launch(ops, cfg, fault="hang@5", thresholds={"train_s": 300, "hang_s": 10})
    info = wait_final(ops, plan.run_id, timeout=280)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    wd = [e for e in kinds(evs, "watchdog") if "without progress" in e["reason"]]
    assert len(wd) == 1 and "idle" in wd[0]["reason"] and "hang_s 10s" in wd[0]["reason"]
    # the last marker attempt 1 printed (a heartbeat or step), then the watchdog: hang_s
    # plus the sampling, far from train_s
    log1 = (root / "runs" / plan.run_id / "attempt-1.log").read_text().splitlines()
    last = max(json.loads(ln[5:])["t"] for ln in log1 if ln.startswith("@dfo "))
    gap = wd[0]["t"] - last
    assert 10 <= gap < 120, gap
    assert kinds(evs, "stacks") and kinds(evs, "classified")[0]["class"] == "compile_hang"
    assert info["last_step"] == 12
