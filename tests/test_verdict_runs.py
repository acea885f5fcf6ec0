"""One answer everywhere: the supervisor's fallback choice and `dfo diagnose` on the same
attempt log agree (real supervisor runs on the local transport), and an own command
whose race class has no ladder restarts unchanged from its newest checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.engine.runs import LaunchOptions
from orchestrator.common.verdict import RETRY_NOTE

from tests.supervisor_env import FAST, events, kinds, local_run_ops, wait_final, write_config

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "own"
PATTERN = r"step (?P<step>\d+) loss \S+ tok/s (?P<tok_s>[\d.]+)"


@pytest.fixture
def setup(tmp_path):
    return local_run_ops(tmp_path)


def diagnose_json(capsys, *args) -> dict:
    capsys.readouterr()
    assert main(["diagnose", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_diagnose_of_a_run_log_names_the_step_the_supervisor_applied(setup, tiny_assets,
                                                                      capsys):
    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets)   # the tiny config: compile off
    plan = run_ops.launch(LaunchOptions(config=str(cfg), run_name="t", fault="fx_race@6",
                                    backoff_scale=0.01, thresholds=dict(FAST),
                                    env_check=False))
    info = wait_final(run_ops, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    applied = kinds(events(root, plan.run_id), "fallback")[0]
    # compile_gate could not change a run that does not compile: the ladder's next step
    assert applied.step == "layout_ddp"
    log1 = root / "runs" / plan.run_id / "attempt-1.log"
    d = diagnose_json(capsys, str(log1))
    assert d["class"] == "fx_trace_race"
    assert d["fallback"]["step"] == applied.step
    assert d["run"]["run_id"] == plan.run_id and d["run"]["applied"] == applied.step
    assert d["assumed"] is None
    # the same log outside its run: an answer over what it assumed, which it says
    alone = tmp / "copy.log"
    alone.write_text(log1.read_text())
    d2 = diagnose_json(capsys, str(alone))
    assert d2["run"] is None and "not in a run directory" in d2["assumed"]
    assert "compile.gate=True" in d2["assumed"]
    d3 = diagnose_json(capsys, str(alone), "--config", str(cfg))
    assert d3["fallback"]["step"] == applied.step   # the same config, the same answer


def test_an_own_deadlock_restarts_unchanged_and_diagnose_reports_the_hang(setup, capsys):
    root, run_ops, tmp = setup
    ck = tmp / "ck"
    rf = tmp / "own.yaml"
    rf.write_text(f"resume: {{glob: '{ck}/step_*'}}\n")
    cmd = ["python", str(FIXTURES / "stall_train.py"), "--workers", "2", "--steps", "6",
           "--stall-at", "3", "--ckpt", str(ck), "--cold-cache", str(tmp / "warm")]
    plan = run_ops.launch(LaunchOptions(command=cmd, run_file=str(rf), run_name="stall",
                                    step_pattern=PATTERN, backoff_scale=0.01,
                                    thresholds=dict(FAST, train_s=300, hang_s=5),
                                    env_check=False))
    info = wait_final(run_ops, plan.run_id, timeout=300)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    assert [c.cls for c in kinds(evs, "classified")] == ["compile_hang", "done"]
    fb = kinds(evs, "fallback")
    assert len(fb) == 1 and fb[0].step is None and fb[0].note == RETRY_NOTE
    assert RETRY_NOTE in fb[0].describe()
    assert info["fallbacks"][0]["note"] == RETRY_NOTE
    assert kinds(evs, "attempt_start")[1].resume == str(ck / "step_2")
    log1 = root / "runs" / plan.run_id / "attempt-1.log"
    # inside its run: the supervisor's class, judged from the attempt's silence
    d = diagnose_json(capsys, str(log1))
    assert d["log_class"] == "crash" and d["class"] == "compile_hang"
    assert d["fallback"]["note"] == RETRY_NOTE and d["run"]["applied"] == ""
    capsys.readouterr()
    assert main(["diagnose", str(log1)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("compile_hang: ") and "restart unchanged" in out
    # the log alone: says what it cannot know instead of calling it a transient crash
    alone = tmp / "copy.log"
    alone.write_text(log1.read_text())
    d2 = diagnose_json(capsys, str(alone))
    assert d2["fallback"] is None and "cannot be told from a hang" in d2["unknown"]
    assert set(d2["alternatives"]) == {"crash", "compile_hang"}
    capsys.readouterr()
    assert main(["diagnose", str(alone)]) == 0
    out = capsys.readouterr().out
    assert "cannot know: " in out
    assert [ln for ln in out.splitlines() if ln.startswith("fallback: ")] == [
        next(ln for ln in out.splitlines() if ln.startswith("fallback: depends on how it ended"))]


def test_an_own_fx_race_without_a_ladder_retries_within_its_budget(setup):
    root, run_ops, tmp = setup
    ck = tmp / "ck"
    rf = tmp / "own.yaml"
    rf.write_text(f"step_pattern: '{PATTERN}'\nresume: {{glob: '{ck}/step_*', "
                  "args: [--resume, '{path}']}\n")
    cmd = ["python", str(FIXTURES / "fxrace_train.py"), "--threads", "3", "--steps", "6",
           "--race-at", "3", "--ckpt", str(ck), "--cold-cache", str(tmp / "warm")]
    plan = run_ops.launch(LaunchOptions(command=cmd, run_file=str(rf), run_name="fx",
                                    backoff_scale=0.01, thresholds=dict(FAST),
                                    env_check=False))
    info = wait_final(run_ops, plan.run_id, timeout=400)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    assert [c.cls for c in kinds(evs, "classified")] == ["fx_trace_race", "done"]
    assert kinds(evs, "fallback")[0].note == RETRY_NOTE
    assert kinds(evs, "attempt_start")[1].argv[-2:] == ["--resume", str(ck / "step_2")]
