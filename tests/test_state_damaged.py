"""A damaged ``state.json`` (truncated, empty, not JSON) of a finished run: the readers
rebuild the run's state from ``events.jsonl`` and say in one line that the state file is
damaged; ``dfo status`` shows the run as it ended, not ``starting``, and ``dfo logs -f``
ends, with the real supervisor and trainer on the local transport."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dfo_contract.state_records import CheckpointRef
from dfo_contract import events as ev
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.supervisor.policy.runstate_replay import state_from_events
from orchestrator.transport.local import LocalTransport
from tests.supervisor_env import FAST, REPO, hosts_yaml, local_host, make_root, wait_final, write_config

DFO = [sys.executable, "-m", "orchestrator.cli"]


def test_the_events_tell_the_state():
    evs = [ev.SupervisorStart(pid=41, mode="setsid", resumed=False, t=10.0),
           ev.AttemptStart(attempt=1, resume=None, overrides={}, argv=["x"], pid=42,
                           log="attempt-1.log", t=11.0),
           ev.Checkpoint(attempt=1, step=4, path="/c/step_4", t=12.0),
           ev.AttemptEnd(attempt=1, exit_code=5, signal=None, duration_s=2.0, t=13.0),
           ev.Classified(attempt=1, cls="fx_trace_race", reason="r", evidence=[], also=[], t=13.5),
           ev.Restart(attempt=2, delay_s=0.1, reason="budget left", t=13.6),
           ev.AttemptStart(attempt=2, resume="/c/step_4", overrides={"compile.gate": True},
                           argv=["x"], pid=43, log="attempt-2.log", t=14.0)]
    st = state_from_events("r1", evs)
    assert (st.status, st.pid, st.attempt, st.last_step) == ("running", 41, 2, 4)
    assert [(a.n, a.cls, a.exit_code) for a in st.attempts] == [(1, "fx_trace_race", 5), (2, None, None)]
    assert st.overrides == {"compile.gate": True} and st.last_event == "attempt 2 started, resuming /c/step_4"
    done = state_from_events("r1", evs + [ev.Final(status="done", reason="reached max_steps",
                                                   last_checkpoint=CheckpointRef(step=12, path="/c/step_12"),
                                                   t=20.0)])
    assert (done.status, done.reason, done.ended_at) == ("done", "reached max_steps", 20.0)
    assert done.last_checkpoint == CheckpointRef(step=12, path="/c/step_12")


@pytest.mark.slow
def test_status_and_logs_of_a_finished_run_with_a_damaged_state_file(tmp_path, tiny_assets):  # noqa: F811
    root = make_root(tmp_path)
    run_ops = RunOps(LocalTransport("local"), local_host(root))
    cfg = write_config(tmp_path / "c.yaml", tiny_assets, train={"max_steps": 4})
    plan = run_ops.launch(LaunchOptions(config=str(cfg), run_name="t", backoff_scale=0.01,
                                    thresholds=dict(FAST), env_check=False))
    assert wait_final(run_ops, plan.run_id)["status"] == "done"
    state = root / "runs" / plan.run_id / "state.json"
    good = state.read_bytes()
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    for damaged in (good[: len(good) // 2], b"", b"not json\n", b"[1, 2]\n"):
        state.write_bytes(damaged)
        info = run_ops.status(plan.run_id)[0]
        assert (info.state.status, info.shown_status, info.state.attempt) == ("done", "done", 1)
        assert info.state_damaged.startswith("state.json is damaged (")
        assert info.state_damaged.endswith("rebuilt from events.jsonl")
        r = subprocess.run([*DFO, "--hosts", str(hosts), "status", "--run", plan.run_id],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
        assert r.returncode == 0 and "done" in r.stdout and "starting" not in r.stdout, r
        warn = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(warn) == 1 and warn[0].startswith(f"dfo: warning: run {plan.run_id}: "
                                                     "state.json is damaged ("), r.stderr
        r = subprocess.run([*DFO, "--hosts", str(hosts), "status", "--run", plan.run_id, "--json"],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
        assert json.loads(r.stdout)["runs"][0]["state_damaged"] == info.state_damaged
        # logs -f ends: the events say the run is over
        r = subprocess.run([*DFO, "--hosts", str(hosts), "logs", "-f", "--run", plan.run_id],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "run done" in r.stdout
