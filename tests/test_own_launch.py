"""`dfo launch -- CMD ARGS...`: own training scripts (tests/fixtures/own) under the real
supervisor on the local transport. Each is classified from its own output or silence, the
run file's ladder is applied in order, and the run ends done."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.engine.runs import LaunchOptions
from orchestrator.common.errors import NotFoundError

from tests.supervisor_env import FAST, events, kinds, local_run_ops, wait_final

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "own"
PATTERN = r"step (?P<step>\d+) loss \S+ tok/s (?P<tok_s>[\d.]+)"


@pytest.fixture
def setup(tmp_path):
    return local_run_ops(tmp_path)


def test_fx_race_of_an_own_script_is_classified_and_its_ladder_applied(setup, capsys):
    root, run_ops, tmp = setup
    ck = tmp / "ck"
    rf = tmp / "own.yaml"
    rf.write_text(f"""\
step_pattern: '{PATTERN}'
resume: {{glob: 'ck/step_*', order: step, args: [--resume, '{{path}}']}}
cwd: {tmp}
fallbacks:
  fx_trace_race:
    - env: {{OWN_NOTE: tried-env}}
    - drop_arg: --threads
""")
    cmd = ["python", str(FIXTURES / "fxrace_train.py"), "--threads", "3", "--steps", "10",
           "--race-at", "5", "--ckpt", str(ck)]
    plan = run_ops.launch(LaunchOptions(command=cmd, run_file=str(rf), run_name="fx",
                                    backoff_scale=0.01, thresholds=dict(FAST), env_check=False))
    info = wait_final(run_ops, plan.run_id, timeout=400)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    cl = kinds(evs, "classified")
    assert [c.cls for c in cl] == ["fx_trace_race", "fx_trace_race", "done"]
    assert any("Detected that you are using FX" in t for t in cl[0].evidence_texts())
    fb = kinds(evs, "fallback")
    assert [f.step for f in fb] == ["env OWN_NOTE=tried-env", "drop --threads"]
    assert fb[1].changed == {"arg --threads": "dropped"}
    starts = kinds(evs, "attempt_start")
    assert starts[0].argv[0] == "python" and "--threads" in starts[0].argv
    assert "--threads" not in starts[2].argv and "3" not in starts[2].argv
    # attempts 2 and 3 resume from the run's own newest checkpoint (step_4)
    assert starts[1].resume == str(ck / "step_4")
    assert starts[2].argv[-2:] == ["--resume", str(ck / "step_4")]
    assert info["last_step"] == 10 and info["tokens_per_s"]
    assert info["overrides"]["env"] == {"OWN_NOTE": "tried-env"}
    assert info["overrides"]["drop"] == ["--threads"]
    assert [f["step"] for f in info["fallbacks"]] == ["env OWN_NOTE=tried-env", "drop --threads"]
    # dfo diagnose on the script's log, with and without its run file
    log1 = root / "runs" / plan.run_id / "attempt-1.log"
    rc = main(["diagnose", str(log1), "--run-file", str(rf), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["class"] == "fx_trace_race"
    assert d["fallback"]["step"] == "env OWN_NOTE=tried-env"
    assert main(["diagnose", str(log1)]) == 0
    assert capsys.readouterr().out.startswith("fx_trace_race: ")


def test_an_own_script_that_deadlocks_is_found_by_its_silence(setup):
    root, run_ops, tmp = setup
    ck = tmp / "ck"
    rf = tmp / "own.yaml"
    rf.write_text(f"""\
resume: {{glob: '{ck}/step_*'}}
fallbacks:
  compile_hang:
    - run_first: [python, -c, "print('warm-up done')"]
    - set_arg: {{--workers: 1}}
""")
    cmd = ["python", str(FIXTURES / "stall_train.py"), "--workers", "2", "--steps", "8",
           "--stall-at", "3", "--ckpt", str(ck)]
    plan = run_ops.launch(LaunchOptions(command=cmd, run_file=str(rf), run_name="stall",
                                    step_pattern=PATTERN, backoff_scale=0.01,
                                    thresholds=dict(FAST, train_s=300, hang_s=5),
                                    env_check=False))
    info = wait_final(run_ops, plan.run_id, timeout=300)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    cl = kinds(evs, "classified")
    assert [c.cls for c in cl] == ["compile_hang", "compile_hang", "done"]
    wd = [e for e in kinds(evs, "watchdog") if "without progress" in e.reason]
    assert len(wd) == 2 and all("idle" in e.reason for e in wd)
    assert kinds(evs, "stacks")                          # kernel stacks of the deadlock
    fb = kinds(evs, "fallback")
    assert [f.step for f in fb] == ["run first: python -c print('warm-up done')",
                                      "set --workers 1"]
    rf_ev = kinds(evs, "run_first")
    assert rf_ev and rf_ev[0].ok and rf_ev[0].attempt == 2
    log2 = (root / "runs" / plan.run_id / "attempt-2.log").read_text()
    assert "warm-up done" in log2
    argv3 = kinds(evs, "attempt_start")[2].argv
    assert argv3[argv3.index("--workers") + 1] == "1" and argv3.count("--workers") == 1
    assert argv3[-2:] == ["--resume", str(ck / "step_2")]
    assert info["last_step"] == 8


def test_the_command_never_meets_a_shell(setup):
    root, run_ops, tmp = setup
    out = tmp / "out.txt"
    evil = "$(touch pwned); `touch pwned2` | ; && 'x\" \\n"
    code = "import sys; open(sys.argv[2], 'w').write(sys.argv[1]); print('step 1 loss 0 tok/s 1')"
    plan = run_ops.launch(LaunchOptions(command=[sys.executable, "-c", code, evil, str(out)],
                                    run_name="quote", backoff_scale=0.01, thresholds=dict(FAST),
                                    env_check=False))
    info = wait_final(run_ops, plan.run_id, timeout=120)
    assert info["status"] == "done", info.get("reason")
    assert out.read_text() == evil
    run_dir = root / "runs" / plan.run_id
    assert not (run_dir / "pwned").exists() and not (run_dir / "pwned2").exists()


def test_resume_latest_is_checked_before_the_start_and_passed_with_the_template(setup):
    root, run_ops, tmp = setup
    ck = tmp / "ck"
    rf = tmp / "own.yaml"
    rf.write_text(f"resume: {{glob: '{ck}/step_*', args: ['--resume={{path}}']}}\n")
    cmd = ["python", str(FIXTURES / "stall_train.py"), "--steps", "6", "--ckpt", str(ck)]
    o = dict(command=cmd, run_file=str(rf), backoff_scale=0.01, thresholds=dict(FAST),
             env_check=False, resume="latest")
    with pytest.raises(NotFoundError, match="nothing matches"):
        run_ops.launch(LaunchOptions(run_name="r0", **o))
    ck.mkdir()
    for n in (2, 10, 4):
        (ck / f"step_{n}").write_text(str(n))
    plan = run_ops.launch(LaunchOptions(run_name="r1", **o))
    assert plan.resume_path == str(ck / "step_10")
    assert plan.first_attempt_argv[-1] == f"--resume={ck}/step_10"
    info = wait_final(run_ops, plan.run_id, timeout=120)
    assert info["status"] == "done" and info["attempts"][0]["resume"] == str(ck / "step_10")
    log = (root / "runs" / plan.run_id / "attempt-1.log").read_text()
    assert "at step 10" in log
