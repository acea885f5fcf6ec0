"""launch_inputs / launch_argv: --resume validation, --set, argvs (pure)."""

from __future__ import annotations

import subprocess

import pytest

from orchestrator.common.errors import ConfigError, NotFoundError
from orchestrator.common.launch_argv import SETSID_SCRIPT, attempt_env, start_argv, trainer_argv
from dfo_contract import trainer_config as tcfg
from dfo_contract.replies import CheckpointListing
from orchestrator.plan.launch_facts import resolve_resume
from orchestrator.plan.launch_inputs import parse_resume, parse_sets
from orchestrator.plan.probes import launch_probe, parse_launch_probe as parse_probe


def probe_argv(root: str, lock: str) -> list[str]:
    return list(launch_probe(root, lock).argv)

ROOT = "/root/dfo"


@pytest.mark.parametrize("value, kind, norm", [
    ("latest", "latest", "latest"),
    ("step_690", "name", "step_690"),
    ("/root/dfo/checkpoints/r/step_5", "path", "/root/dfo/checkpoints/r/step_5"),
    ("/root/dfo/checkpoints//r/./step_5", "path", "/root/dfo/checkpoints/r/step_5"),
])
def test_resume_accepted(value, kind, norm):
    r = parse_resume(value, ROOT)
    assert (r.kind, r.value) == (kind, norm)


@pytest.mark.parametrize("value", [
    "step_690; rm -rf /", "step_690 && reboot", "$(reboot)", "`id`", "step_", "step_x",
    "../step_1", "/etc/passwd", "/root/dfo/../etc/passwd", "/root/dfo", "/root/dfoX/step_1",
    "/root/dfo/checkpoints/r/step_5;id", "-rf", "step_690\nid", "", "latest; id",
])
def test_resume_rejected(value):
    with pytest.raises(ConfigError) as ei:
        parse_resume(value, ROOT)
    msg = str(ei.value)
    assert "\n" not in msg.replace(repr(value), "") and "step_690" in msg


LISTING = {"checkpoints": [
    {"name": "step_20", "path": "/r/ck/step_20", "step": 20, "valid": True},
    {"name": "step_40", "path": "/r/ck/step_40", "step": 40, "valid": False,
     "reason": "drafter.safetensors: sha256 mismatch"},
    {"name": "step_10", "path": "/r/ck/step_10", "step": 10, "valid": True},
]}


def test_resolve_resume():
    lst = CheckpointListing.from_json(LISTING).oldest_first()
    assert [c.step for c in lst] == [10, 20, 40]
    assert resolve_resume(parse_resume("latest", ROOT), lst, "/r/ck") == "/r/ck/step_20"
    assert resolve_resume(parse_resume("step_10", ROOT), lst, "/r/ck") == "/r/ck/step_10"
    with pytest.raises(NotFoundError, match=r"step_690: no such checkpoint.*step_10, step_20"):
        resolve_resume(parse_resume("step_690", ROOT), lst, "/r/ck")
    with pytest.raises(NotFoundError, match=r"step_40: checkpoint is incomplete.*sha256"):
        resolve_resume(parse_resume("step_40", ROOT), lst, "/r/ck")
    with pytest.raises(NotFoundError, match="no valid checkpoint"):
        resolve_resume(parse_resume("latest", ROOT), [], "/r/ck")


def test_parse_sets():
    sets = parse_sets(["train.micro_batch=4", "compile.gate=false",
                       "parallel.drafter_devices=[cuda:0,cuda:1]", "model.attention=sdpa"])
    typed = tcfg.flat(tcfg.apply_overrides(tcfg.TrainerConfig(), sets, validate_now=False))
    assert {k: typed[k] for k, _ in sets} == {
        "train.micro_batch": 4, "compile.gate": False,
        "parallel.drafter_devices": ["cuda:0", "cuda:1"], "model.attention": "sdpa"}
    for bad in ["train", "train.micro_batch", "Train.x=1", "a.b.c=1", "run.dir=/x"]:
        with pytest.raises(ConfigError):
            parse_sets([bad])


def test_trainer_argv_renders_overrides():
    argv = trainer_argv("/r/envs/current/bin/python", "/r/runs/x/config.yaml",
                        {"compile.gate": True, "parallel.drafter_devices": ["cuda:0"]},
                        run_dir="/r/runs/x", checkpoint_dir="/r/ck", resume="/r/ck/step_20")
    assert argv[:5] == ["/r/envs/current/bin/python", "-m", "orchestrator.supervisor.shim",
                        "trainer", "train"]
    assert "--compile.gate=true" in argv
    assert "--parallel.drafter_devices=[cuda:0]" in argv
    assert argv[-2:] == ["--resume", "/r/ck/step_20"]
    ddp = trainer_argv("py", "c.yaml", {}, run_dir="/d", checkpoint_dir="/c", resume=None,
                       layout="ddp", nproc=2)
    assert ddp[:7] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       "-m", "orchestrator.supervisor.shim"]


def test_start_argv_systemd_and_setsid():
    sd = start_argv("/r/py", "/r/runs/x", "x", systemd=True)
    assert sd[0] == "systemd-run" and "--unit=dfo-x" in sd and "--collect" in sd
    assert sd[-5:] == ["/r/py", "-m", "orchestrator.supervisor", "--run-dir", "/r/runs/x"]
    ss = start_argv("/r/py", "/r/runs/x", "x", systemd=False)
    assert ss[:4] == ["setsid", "-f", "sh", "-c"] and ss[4] == SETSID_SCRIPT
    import re
    assert not re.search(r"&\s*($|\n|;)", SETSID_SCRIPT), "never background with &"
    assert ss[6] == "/r/runs/x/supervisor.log"


def test_setsid_script_detaches_and_takes_values_as_parameters(tmp_path):
    """Run the real script: values with shell metacharacters stay data."""
    log = tmp_path / "sup; touch PWNED.log"
    marker = tmp_path / "out"
    argv = ["setsid", "-f", "sh", "-c", SETSID_SCRIPT, "dfo-supervisor", str(log),
            "sh", "-c", 'echo "$1" > "$2"', "x", "$(touch PWNED) `id`", str(marker)]
    p = subprocess.run(argv, capture_output=True, timeout=10, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout == b"" and p.stderr == b""
    import time
    deadline = time.monotonic() + 60      # setsid -f: the command runs on after setsid exits
    while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "$(touch PWNED) `id`\n"
    assert not (tmp_path / "PWNED").exists()


def test_probe_script_runs(tmp_path):
    (tmp_path / "locks").mkdir()
    lock = tmp_path / "locks" / "run.lock"
    p = subprocess.run(probe_argv(str(tmp_path), str(lock)), capture_output=True, text=True)
    d = parse_probe(p.stdout)
    assert d.env == "0" and d.lock == "free" and d.setsid == "1"
    lock.write_text("run-1\n")
    holder = subprocess.Popen(["flock", str(lock), "sleep", "30"])
    try:
        import time
        deadline = time.monotonic() + 60  # until flock (a process starting) holds it
        while time.monotonic() < deadline:
            d = parse_probe(subprocess.run(probe_argv(str(tmp_path), str(lock)),
                                           capture_output=True, text=True).stdout)
            if d.lock == "held":
                break
            time.sleep(0.1)
        assert d.lock == "held" and d.lock_owner == "run-1"
    finally:
        holder.kill()
        holder.wait()


def test_attempt_env():
    e = attempt_env({"TORCHINDUCTOR_CACHE_DIR": "/c"}, attempt=2, run_dir="/d", fault="oom@3")
    assert e == {"TORCHINDUCTOR_CACHE_DIR": "/c", "DFO_ATTEMPT": "2", "DFO_RUN_DIR": "/d",
                 "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", "DFO_FAULT": "oom@3"}
    assert "DFO_FAULT" not in attempt_env({"DFO_FAULT": "x"}, attempt=1, run_dir="/d", fault=None)


def test_an_override_value_never_becomes_a_trainer_flag():
    """`--set data.path=--resume=/x` must not smuggle a --resume past parse_resume."""
    from trainer.__main__ import split_args

    argv = trainer_argv("py", "c.yaml", {"data.path": "--resume=/etc", "train.lr": 0.1},
                        run_dir="/d", checkpoint_dir="/c", resume=None)
    config, own, rest = split_args(argv[argv.index("train") + 1:], ("--resume",))
    assert config == "c.yaml" and "--resume" not in own
    assert "--data.path=--resume=/etc" in rest
    # the two-token form typed by hand is read the same way: the value stays data
    config, own, rest = split_args(["--data.path", "--resume=/etc", "--resume", "latest"],
                                   ("--resume",))
    assert own == {"--resume": "latest"} and rest == ["--data.path", "--resume=/etc"]
