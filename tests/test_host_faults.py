"""Faults of one host met by the real supervisor (local transport, real processes, an own
command that reports steps): the deployed env gone before a restart, goodput across a clock
step, a stopped supervisor, outside signals at start-up, a full run directory."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from dfo_contract.procs import supervisor_alive
from orchestrator.cli import main
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.supervisor.procs import processes_of_run
from orchestrator.supervisor.runfiles import notice_paths
from orchestrator.transport.local import LocalTransport
from tests.helpers.tmpfs import fill, tmpfs  # noqa: F401
from tests.supervisor_env import (FAST, events, hosts_yaml, local_host, make_root, wait_final,
                                  wait_for)

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


#: a wall clock that the test steps: every time.time() of the run's processes (supervisor,
#: trainer, status probe) adds the offset written in the file named by DFO_TEST_CLOCK, as a
#: step of CLOCK_REALTIME (NTP, a hand-set date) does; their monotonic clock is untouched
CLOCK_SHIM = '''import os, time
_real, _file = time.time, os.environ.get("DFO_TEST_CLOCK")
def _stepped():
    try:
        with open(_file) as f:
            return _real() + float(f.read() or 0)
    except (OSError, ValueError):
        return _real()
if _file:
    time.time = _stepped
'''


def test_goodput_across_a_step_of_the_wall_clock_stays_true(tmp_path, host, monkeypatch):
    root, run_ops = host
    shim = tmp_path / "clock"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(CLOCK_SHIM)
    offset = tmp_path / "offset"
    offset.write_text("0")
    monkeypatch.setenv("DFO_TEST_CLOCK", str(offset))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(shim), *filter(None, [os.environ.get("PYTHONPATH")])]))
    began = time.monotonic()
    run_id = launch_steps(tmp_path, run_ops, sys.executable, "clock")
    wait_for(lambda: (run_ops.status(run_id)[0].state.last_step or 0) >= 10, 120, "steps")
    offset.write_text(str(-0.9 * (time.monotonic() - began)))    # the clock steps back
    at = run_ops.status(run_id)[0].state.last_step
    wait_for(lambda: (run_ops.status(run_id)[0].state.last_step or 0) >= at + 10, 120,
             "steps after the step")
    live, so_far = run_ops.status(run_id)[0].time, time.monotonic() - began
    assert live is not None and live.wall_s > 0.5 * so_far and live.goodput <= 1, live
    run_ops.stop(run_id)
    took = time.monotonic() - began
    info = wait_final(run_ops, run_id, 120)
    g = info["time"]
    assert 0 < g["goodput"] <= 1, g
    # the wall time is the time that passed, not the clock's reading of it
    assert took * 0.5 < g["wall_s"] <= took + 1, (g, took)
    assert g["train_s"] <= g["wall_s"]
    final = events(root, run_id)[-1]
    assert final.kind == "final" and 0 < final.goodput <= 1, final


def test_a_stopped_supervisor_shows_not_responding_with_its_heartbeat_age(
        tmp_path, host, capsys):
    root, run_ops = host
    run_id = launch_steps(tmp_path, run_ops, sys.executable, "sigstop",
                          thresholds={"silent_s": 2})
    wait_for(lambda: (run_ops.status(run_id)[0].state.last_step or 0) >= 2, 120, "steps")
    info = run_ops.status(run_id)[0]
    assert info.shown_status == "running" and info.beat_age_s is not None \
        and info.beat_age_s <= 2, info
    pid = info.state.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        info = wait_for(lambda: (r := run_ops.status(run_id)[0]).shown_status
                        == "not_responding" and r, 60, "not responding")
        assert info.live and info.beat_age_s > 2, info
        assert f"the supervisor (pid {pid}) is not responding" in info.not_responding
        assert f"kill -CONT {pid}" in info.not_responding, info.not_responding
        hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
        assert main(["--hosts", str(hosts), "status", "--run", run_id]) == 0
        out = capsys.readouterr()
        assert "not_responding" in out.out, out.out
        assert f"run {run_id}: the supervisor (pid {pid}) is not responding" in out.err
        assert main(["--hosts", str(hosts), "status", "--json"]) == 0
        row = json.loads(capsys.readouterr().out)["runs"][0]
        assert row["shown_status"] == "not_responding" and row["beat_age_s"] > 2, row
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: run_ops.status(run_id)[0].shown_status == "running", 60, "running again")
    run_ops.stop(run_id)
    assert wait_final(run_ops, run_id, 120)["status"] == "stopped"


def test_a_full_run_directory_ends_the_run_once_and_status_says_why(
        tmp_path, host, tmpfs, capsys):  # noqa: F811
    root, run_ops = host
    fs = tmpfs(8 << 20, root / "runs")     # the runs' filesystem, its own small disk
    run_id = launch_steps(tmp_path, run_ops, sys.executable, "full")
    run_dir = root / "runs" / run_id
    wait_for(lambda: (run_ops.status(run_id)[0].state.last_step or 0) >= 2, 120, "steps")
    pid = run_ops.status(run_id)[0].state.pid
    notice = notice_paths(str(run_dir))[1]    # beside the run directory is full as well
    try:
        fill(fs, 0)                             # state.json, events.jsonl: ENOSPC

        def ended():
            info = run_ops.status(run_id)[0]
            return info if info.shown_status != "running" else None
        info = wait_for(ended, 120, lambda: f"the run to end: {sup_log(root, run_id)}")
        assert info.shown_status == "failed" and not info.live, info
        reason = info.state.reason
        assert reason.startswith(f"the run directory {run_dir} is on a full filesystem "
                                 f"(ENOSPC writing {run_dir}/"), reason
        assert "free space there" in reason and \
            reason.endswith("then dfo launch --resume latest"), reason
        assert info.notice == notice
        wait_for(lambda: not processes_of_run(str(run_dir)), 60, "the run's processes to go")
        # never restarted into the same error, nor back by itself once space is freed
        (fs / "filler").unlink()
        log = sup_log(root, run_id)
        assert "Traceback" not in log and log.count("is on a full filesystem") <= 1, log
        assert not supervisor_alive(str(run_dir), pid)
        hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
        assert main(["--hosts", str(hosts), "status", "--run", run_id]) == 0
        assert f"run {run_id} failed: the run directory {run_dir} is on a full filesystem" \
            in capsys.readouterr().err
    finally:
        if os.path.exists(notice):
            os.unlink(notice)
