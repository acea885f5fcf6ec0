"""Supervising an own command: the pure parts (run_ops.own, the run file, the watchdog's
step pattern and CPU progress) and the CLI's `dfo launch -- CMD` plan. No processes run."""

from __future__ import annotations

import json

import pytest

from dfo_contract.own_ladder import LadderStep
from orchestrator.cli import main
from orchestrator.config.own_runfile import parse_run_file
from orchestrator.common.errors import ConfigError
from orchestrator.common import own_trainer
from orchestrator.supervisor.policy.watchdog import AttemptWatchdog, StepProgress, Thresholds
from tests.supervisor_env import hosts_yaml, make_root

PAT = r"step (?P<step>\d+) .*tok/s (?P<tok_s>[\d.]+)"


def test_step_pattern():
    p = own_trainer.compile_step_pattern(PAT)
    m = own_trainer.match_step(p, "step 12 loss 2.1 tok/s 345.5")
    assert (type(m).__name__, m.step, m.tokens_per_s) == ("StepMarker", 12, 345.5)
    assert own_trainer.match_step(p, "loading") is None
    assert own_trainer.match_step(own_trainer.compile_step_pattern(r"it (?P<step>\d+)"), "it 3").step == 3
    with pytest.raises(ConfigError, match="named group 'step'"):
        own_trainer.compile_step_pattern(r"step \d+")
    with pytest.raises(ConfigError, match="not a regular expression"):
        own_trainer.compile_step_pattern(r"step (")


def test_argv_changes_keep_a_list():
    cmd = ["python", "train.py", "--threads", "4", "--lr=0.1", "--compile", "--out", "x"]
    ch = own_trainer.Changes(drop=["--threads", "--lr", "--compile"], set_args={"--out": "y; rm -rf /"})
    assert own_trainer.attempt_argv(cmd, ch, resume_path="/c/step_4",
                            resume_args=["--resume", "{path}"]) == \
        ["python", "train.py", "--out", "y; rm -rf /", "--resume", "/c/step_4"]
    assert own_trainer.attempt_argv(cmd, own_trainer.Changes()) == cmd
    assert own_trainer.attempt_argv(["t"], own_trainer.Changes(), resume_path="/p",
                            resume_args=["--ckpt={path}"]) == ["t", "--ckpt=/p"]


def test_ladder_applies_in_order_and_skips_what_changes_nothing():
    ladder = own_trainer.check_ladders({"fx_trace_race": [
        {"env": {"A": 1}}, {"env": {"A": "1"}}, {"drop_arg": "--threads"},
        {"run_first": ["python", "warm.py"]}]})["fx_trace_race"]
    c = own_trainer.next_step("fx_trace_race", ladder, 0, own_trainer.Changes())
    assert c.step == "env A=1" and c.changed == {"env.A": "1"} and c.position == 1
    c = own_trainer.next_step("fx_trace_race", ladder, c.position, c.changes)   # env A=1 again: skipped
    assert c.step == "drop --threads" and c.position == 3
    c = own_trainer.next_step("fx_trace_race", ladder, c.position, c.changes)
    assert c.step == "run first: python warm.py" and c.changes.first == [["python", "warm.py"]]
    c = own_trainer.next_step("fx_trace_race", ladder, c.position, c.changes)
    assert c.exhausted and c.step is None
    t = own_trainer.next_step("crash", [], 0, own_trainer.Changes(env={"B": "2"}))
    assert not t.exhausted and t.step is None and t.changes.env == {"B": "2"}
    assert own_trainer.Changes.from_json(c.changes.to_json()) == c.changes


@pytest.mark.parametrize("step,msg", [
    ({"env": {"1A": "x"}}, "not a variable name"),
    ({"set_arg": {"threads": 1}}, "not a flag"),
    ({"drop_arg": "--x; rm"}, "not a flag"),
    ({"run_first": "python warm.py"}, "list of strings"),
    ({"compile_gate": True}, "unknown fallback step"),
    ({"env": {"A": 1}, "drop_arg": "--x"}, "one key"),
])
def test_bad_steps(step, msg):
    with pytest.raises(ConfigError, match=msg):
        own_trainer.check_step(step, "fallbacks.oom[0]")


def test_newest_checkpoint_orders():
    found = [("/c/step_9", 30.0), ("/c/step_10", 20.0), ("/c/step_2", 40.0)]
    assert own_trainer.newest_checkpoint(found, "step") == "/c/step_10"
    assert own_trainer.newest_checkpoint(found, "mtime") == "/c/step_2"
    assert own_trainer.newest_checkpoint(found, "name") == "/c/step_9"
    assert own_trainer.newest_checkpoint([], "step") is None


RUN_FILE = """\
command: [python, train.py, --threads, 4]
step_pattern: 'step (?P<step>\\d+)'
resume: {glob: 'ckpt/step_*', order: mtime}
fallbacks:
  fx_trace_race:
    - run_first: [python, warm.py]
    - drop_arg: --threads
thresholds: {hang_s: 30}
"""


def test_run_file_ok():
    rf = parse_run_file(RUN_FILE, "own.yaml")
    assert rf["command"] == ["python", "train.py", "--threads", "4"]
    assert rf["resume"] == {"glob": "ckpt/step_*", "order": "mtime", "args": ["--resume", "{path}"]}
    assert rf["fallbacks"]["fx_trace_race"][1] == LadderStep(drop_arg="--threads")
    assert rf["fallbacks"]["fx_trace_race"][1].to_json() == {"drop_arg": "--threads"}
    assert rf["thresholds"] == {"hang_s": 30.0}


@pytest.mark.parametrize("edit,where", [
    (("thresholds: {hang_s: 30}", "threshold: {hang_s: 30}"), "own.yaml:8: unknown key 'threshold'"),
    (("    - drop_arg: --threads", "    - drop: --threads"), "own.yaml:7: fallbacks.fx_trace_race[1]: unknown fallback step 'drop'"),
    (("  fx_trace_race:", "  fx_race:"), "own.yaml:5: fallbacks: unknown failure class 'fx_race'"),
    (("'step (?P<step>\\d+)'", "'step (\\d+)'"), "own.yaml:2: step_pattern: needs a named group"),
    (("order: mtime", "order: newest"), "own.yaml:3: resume.order"),
    (("command: [python, train.py, --threads, 4]", "command: [python, train.py"), "own.yaml:2: not valid YAML"),
])
def test_run_file_errors_name_file_and_line(edit, where):
    with pytest.raises(ConfigError) as e:
        parse_run_file(RUN_FILE.replace(*edit), "own.yaml")
    assert str(e.value).startswith(where) and "\n" not in str(e.value)


T = Thresholds(warmup_s=900, train_s=300, live_grace_s=5, kill_grace_s=3, stop_timeout_s=40,
               hang_s=60)


def test_watchdog_reads_steps_from_the_pattern():
    w = AttemptWatchdog(T, now=0.0, step_pattern=own_trainer.compile_step_pattern(PAT))
    assert w.feed("step 3 loss 1.0 tok/s 512.0", 1.0) == [StepProgress(3, 512.0, None)]
    assert w.reached_train and w.feed("epoch 1", 2.0) == []


def test_an_own_trainer_busy_and_silent_is_never_killed_idle_is():
    w = AttemptWatchdog(T, now=0.0, cpu_is_progress=True)
    cpu = 0.0
    for t in range(1, 3000):               # silent, one core busy: CPU time is progress
        cpu += 1.0
        w.activity(float(t), cpu)
        assert w.tick(float(t)) == []
    for t in range(3000, 3100):            # deadlocked: no CPU
        w.activity(float(t), cpu)
        acts = w.tick(float(t))
        if acts:
            break
    assert [type(a).__name__ for a in acts] == ["Warn", "DumpStacks", "Kill"]
    assert 3058 <= t <= 3062 and "idle" in w.hang


@pytest.fixture
def hosts(tmp_path):
    return hosts_yaml(tmp_path / "hosts.yaml", make_root(tmp_path))


def test_cli_dry_run_plans_the_command_as_given(hosts, capsys, tmp_path):
    rf = tmp_path / "own.yaml"
    (tmp_path / "train.py").write_text("")        # the relative script, in the run file's cwd
    rf.write_text(f"cwd: {tmp_path}\nfallbacks:\n  oom:\n    - set_arg: {{--batch: 4}}\n")
    rc = main(["--hosts", str(hosts), "launch", "--dry-run", "--json", "--no-env-check",
               "--run-file", str(rf), "--step-pattern", PAT, "--run-name", "mine", "--",
               "python", "train.py", "--threads", "4", "--note", "$(reboot); x"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["started"] is False
    assert out["first_attempt_argv"] == ["python", "train.py", "--threads", "4", "--note",
                                         "$(reboot); x"]
    assert out["ladders"] == {"oom": ["set --batch 4"]} and out["run_id"].startswith("mine-")


def test_cli_an_own_trainer_gets_the_env_check(hosts, capsys):
    """`dfo launch -- CMD` checks the deployed env against its lock like the bundled trainer
    (this root's envs/current is a venv dfo did not deploy: exit 7, one line)."""
    rc = main(["--hosts", str(hosts), "launch", "--dry-run", "--json", "--", "python",
               "train.py"])
    err = capsys.readouterr().err.strip()
    assert rc == 7 and "envs/current differs from its lock" in err, err
    assert len(err.splitlines()) == 1


def test_cli_bad_run_file_is_one_line_exit_2(hosts, capsys, tmp_path):
    rf = tmp_path / "own.yaml"
    rf.write_text("command: [python, t.py]\nfallbacks:\n  oom:\n    - halve: batch\n")
    rc = main(["--hosts", str(hosts), "launch", "--dry-run", "--run-file", str(rf)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"dfo: error: {rf}:4: fallbacks.oom[0]: unknown fallback")
    assert len(err.splitlines()) == 1


def test_cli_a_stray_config_file_is_not_a_command(hosts, capsys):
    rc = main(["--hosts", str(hosts), "launch", "--dry-run", "my.yaml"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "'my.yaml' is not a command" in err and "--config FILE" in err


def test_ladder_flags():
    assert own_trainer.ladders_from_flags([
        "fx_trace_race=run_first:python warm.py --threads '1 2'",
        "fx_trace_race=drop_arg:--threads",
        "oom=set_arg:--batch-size=2", "compile_hang=env:TORCHINDUCTOR_COMPILE_THREADS=1"]) == {
        "fx_trace_race": [LadderStep(run_first=["python", "warm.py", "--threads", "1 2"]),
                          LadderStep(drop_arg="--threads")],
        "oom": [LadderStep(set_arg={"--batch-size": "2"})],
        "compile_hang": [LadderStep(env={"TORCHINDUCTOR_COMPILE_THREADS": "1"})]}
    for bad, msg in (("fx_trace_race", "CLASS=KIND:VALUE"), ("fx=drop_arg:--x", "unknown failure"),
                     ("oom=set_arg:--b", "NAME=VALUE"), ("oom=halve:x", "unknown fallback step"),
                     ("oom=run_first:python 'x", "quotation")):
        with pytest.raises(ConfigError, match=msg):
            own_trainer.parse_ladder_flag(bad)


def test_cli_flags_give_resume_and_ladder_without_a_run_file(hosts, capsys, tmp_path):
    (tmp_path / "t.py").write_text("")    # the relative script, where the command runs
    (tmp_path / "cwd.yaml").write_text(f"cwd: {tmp_path}\n")
    rc = main(["--hosts", str(hosts), "launch", "--dry-run", "--json", "--no-env-check",
               "--run-file", str(tmp_path / "cwd.yaml"), "--resume-glob", "ck/ep_*", "--resume-args", "--from {path} --strict",
               "--ladder", "fx_trace_race=drop_arg:--threads",
               "--ladder", "fx_trace_race=set_arg:--workers=1", "--", "python", "t.py"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ladders"] == {"fx_trace_race": ["drop --threads", "set --workers 1"]}
    # the plan's spec carries them for the supervisor (the run file gives only cwd:)
    assert out["first_attempt_argv"] == ["python", "t.py"]


def test_resume_flags_reach_the_spec(tmp_path):
    from orchestrator.engine.runs import LaunchOptions, RunOps
    from orchestrator.transport.local import LocalTransport
    from tests.supervisor_env import local_host

    run_ops = RunOps(LocalTransport("local"), local_host(make_root(tmp_path)))
    (tmp_path / "t.py").write_text("")    # the relative script, where the command runs
    (tmp_path / "cwd.yaml").write_text(f"cwd: {tmp_path}\n")
    plan = run_ops.plan(LaunchOptions(command=["python", "t.py"], resume_glob="ck/ep_*",
                                  resume_order="mtime", resume_args="--from {path} --strict",
                                  env_check=False, run_file=str(tmp_path / "cwd.yaml")))
    assert plan.spec.to_json()["trainer"]["resume"] == {"glob": "ck/ep_*", "order": "mtime",
                                                        "args": ["--from", "{path}", "--strict"]}
    with pytest.raises(ConfigError, match="with \\{path\\} in one"):
        run_ops.plan(LaunchOptions(command=["python", "t.py"], resume_glob="ck/*",
                               resume_args="--from", env_check=False))


def test_a_ladder_step_and_the_changes_are_records_in_their_json_shape():
    from dfo_contract.errors import ContractError
    from dfo_contract.own_ladder import Changes

    for raw in ({"env": {"A": "1"}}, {"set_arg": {"--b": "2"}}, {"drop_arg": "--x"},
                {"run_first": ["python", "warm.py"]}):
        assert LadderStep.from_json(raw).to_json() == raw
    for bad in ({}, {"env": {"A": "1"}, "drop_arg": "--x"}):
        with pytest.raises(ContractError, match="exactly one of env, set_arg"):
            LadderStep.from_json(bad)
    ch = own_trainer.apply_step(Changes(), LadderStep(drop_arg="--x"))[0]
    # state.json's overrides of an own run are the changes' JSON, read tolerant
    assert Changes.from_json(ch.to_json()) == ch and Changes.from_json(None) == Changes()
    assert Changes.from_json({"drop": "--x", "env": {"A": "1"}}) == Changes(env={"A": "1"})


def test_the_config_in_force_is_typed_by_its_trainer_in_state_json():
    """state.json's ``overrides``: a bundled run's flat overrides stay a mapping, an own
    run's changes come back as Changes (written with their kind first); an own run's
    changes written without a kind read as the changes they hold."""
    from dfo_contract.runstate import RunState
    from dfo_contract.state_records import changes_of, config_overrides, set_only

    ch = own_trainer.Changes(env={"A": "1"}, drop=["--threads"])
    own = RunState.from_json(json.loads(json.dumps(RunState(run_id="r", overrides=ch).to_json())))
    assert own.overrides == ch and isinstance(own.overrides, own_trainer.Changes)
    assert list(RunState(run_id="r", overrides=ch).to_json()["overrides"])[0] == "kind"
    flat = RunState.from_json({"run_id": "r", "overrides": {"train.micro_batch": 4}})
    assert flat.overrides == {"train.micro_batch": 4}
    assert config_overrides(flat.overrides) == {"train.micro_batch": 4}
    assert config_overrides(own.overrides) == {}
    bare = RunState.from_json({"run_id": "r", "overrides": {"env": {"A": "1"}, "drop": ["--threads"]}})
    assert changes_of(bare.overrides) == ch
    assert set_only(own_trainer.Changes()) == set_only({}) == {}
    assert set_only(ch) == {"env": {"A": "1"}, "drop": ["--threads"]}
    # state.json is read tolerant: an unknown kind is no config in force, not a lost run
    assert RunState.from_json({"run_id": "r", "overrides": {"kind": "mine"}}).overrides == {}
