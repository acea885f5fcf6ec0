"""Faults of one host met by the real supervisor (local transport, real processes, an own
command that reports steps): the deployed env gone before a restart, goodput across a clock
step, a stopped supervisor, outside signals at start-up, a full run directory."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.transport.local import LocalTransport
from tests.supervisor_env import FAST, events, local_host, make_root, wait_final, wait_for

#: an own command that reports a step every 0.2 s until it is stopped
STEPS = ("import time\nfor i in range(1, 10**6):\n"
         "    print(f'step {i} loss 1.0 tok/s 10', flush=True)\n    time.sleep(0.2)\n")
PATTERN = r"step (?P<step>\d+) loss \S+ tok/s (?P<tok_s>[\d.]+)"


@pytest.fixture
def host(tmp_path, monkeypatch):
    monkeypatch.delenv("DFO_HOSTS", raising=False)
    root = make_root(tmp_path)
    return root, RunOps(LocalTransport("local"), local_host(root))


def final_state(root, run_id: str) -> dict | None:
    try:
        st = json.loads((root / "runs" / run_id / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return st if st.get("status") in ("done", "failed", "stopped") else None


def sup_log(root, run_id: str) -> str:
    return (root / "runs" / run_id / "supervisor.log").read_text()


def launch_steps(tmp_path, run_ops, argv0: str, name: str, **kw) -> str:
    script = tmp_path / f"{name}.py"
    script.write_text(kw.pop("body", STEPS))
    return run_ops.launch(LaunchOptions(
        command=[argv0, str(script)], run_name=name, backoff_scale=0.01, step_pattern=PATTERN,
        thresholds={**FAST, **kw.pop("thresholds", {})}, env_check=False, **kw)).run_id


def test_the_deployed_env_gone_before_a_restart_ends_the_run_failed_naming_deploy(
        tmp_path, host):
    root, run_ops = host
    env_python = str(root / "envs" / "current" / "bin" / "python")
    run_id = launch_steps(tmp_path, run_ops, env_python, "envgone")
    wait_for(lambda: (run_ops.status(run_id)[0].state.last_step or 0) >= 2, 120, "steps")
    trainer = run_ops.status(run_id)[0].state.trainer_pids[0]
    os.unlink(root / "envs" / "current")       # an undeploy, a half-done switch, a rm
    os.kill(trainer, signal.SIGKILL)           # the attempt ends: the next needs the env
    # dfo status needs the env too (it says so): the run's own record
    info = wait_for(lambda: final_state(root, run_id), 60,
                    lambda: f"the run to end: {sup_log(root, run_id)}")
    assert info["status"] == "failed", info
    reason = info["reason"]
    assert f"{root}/envs/current" in reason and "dfo deploy" in reason, reason
    assert reason.endswith("then dfo launch --resume latest"), reason
    evs = events(root, run_id)
    assert evs[-1].kind == "final" and evs[-1].status == "failed"
    # no attempt that never started is recorded
    assert [e.attempt for e in evs if e.kind == "attempt_start"] == [1]
    log = (root / "runs" / run_id / "supervisor.log").read_text()
    assert "Traceback" not in log, log
