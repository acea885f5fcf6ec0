"""First runs of your own trainer through the real CLI on the local transport: a run file
whose `cwd:` is not a directory, a script path the host does not have and a `--` with
nothing after it are refused before any run exists (`--dry-run` included); a program that
cannot start ends its run `failed` at once, saying why; a supervisor that dies at start is
reported at once with its own last line; a command that exits 0 is "the command exited 0"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.engine.runs import RunOps
from orchestrator.common.errors import RunFailed
from orchestrator.transport.local import LocalTransport
from tests.supervisor_env import dfo, events, hosts_yaml, local_host, make_root, wait_final

PATTERN = r"step (?P<step>\d+) loss \S+"
SCRIPT = "import sys\nfor i in range(1, 4):\n    print(f'step {i} loss 1.0', flush=True)\n"


@pytest.fixture
def env(tmp_path, monkeypatch):
    root = make_root(tmp_path)
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    monkeypatch.chdir(tmp_path)
    return root, hosts, tmp_path


def runs(root: Path) -> list[str]:
    d = root / "runs"
    return sorted(os.listdir(d)) if d.is_dir() else []


@pytest.mark.parametrize("dry", [["--dry-run"], []])
def test_a_run_file_cwd_that_is_not_a_directory_is_refused_before_any_run(env, capsys, dry):
    root, hosts, tmp = env
    (tmp / "a-file").write_text("")
    for cwd in ("/no/such/dir-dfo", str(tmp / "a-file")):
        rf = tmp / "own.yaml"
        rf.write_text(f"cwd: {cwd}\n")
        t0 = time.monotonic()
        rc, out, err = dfo(capsys, hosts, "launch", "--no-env-check", *dry, "--run-file",
                           str(rf), "--step-pattern", PATTERN, "--", sys.executable, "-c", "1")
        assert rc == 2, (out, err)
        assert f"cwd: {cwd} is not a directory on local" in err and err.count("\n") == 1
        assert time.monotonic() - t0 < 30 and runs(root) == []


def test_a_relative_script_is_taken_from_cwd_and_refused_when_not_there(env, capsys):
    root, hosts, tmp = env
    rc, out, err = dfo(capsys, hosts, "launch", "--no-env-check", "--dry-run",
                       "--step-pattern", PATTERN, "--", "python", "train.py")
    assert rc == 2, (out, err)
    assert "python train.py:" in err and "does not exist on local" in err
    assert "the run's own new directory" in err and "cwd:" in err and runs(root) == []
    proj = tmp / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT)
    rf = tmp / "own.yaml"
    rf.write_text(f"cwd: {proj}\nstep_pattern: '{PATTERN}'\n")
    rc, out, err = dfo(capsys, hosts, "launch", "--no-env-check", "--backoff-scale", "0.01",
                       "--run-file", str(rf), "--json", "--", "python", "train.py")
    assert rc == 0, err
    run_id = json.loads(out)["run_id"]
    info = wait_final(RunOps(LocalTransport("local"), local_host(root)), run_id, timeout=120)
    assert info["status"] == "done", info.get("reason")
    assert info["reason"] == "the command exited 0 at step 3"
    cl = [e for e in events(root, run_id) if e.kind == "classified"]
    assert [(c.cls, c.reason) for c in cl] == [("done", "the command exited 0")]


def test_dash_dash_with_nothing_after_it_is_refused(env, capsys):
    root, hosts, _ = env
    for dry in (["--dry-run"], []):
        rc, out, err = dfo(capsys, hosts, "launch", "--no-env-check", *dry, "--")
        assert rc == 2 and "no command after `--`" in err and out == "", (out, err)
    assert runs(root) == []


def test_a_program_that_cannot_start_fails_its_run_at_once_saying_why(env, capsys):
    root, hosts, tmp = env
    prog = tmp / "train"
    prog.write_text("#!/no/such/interpreter-dfo\nprint(1)\n")
    prog.chmod(0o755)
    t0 = time.monotonic()
    rc, out, err = dfo(capsys, hosts, "launch", "--no-env-check", "--", str(prog))
    assert rc == 10, (out, err)
    assert "interpreter /no/such/interpreter-dfo does not exist" in err
    assert time.monotonic() - t0 < 30
    (run_id,) = runs(root)
    info = RunOps(LocalTransport("local"), local_host(root)).one(run_id)
    assert info.shown_status == "failed" and "/no/such/interpreter-dfo" in info.state.reason


def test_a_supervisor_that_died_at_start_is_reported_at_once_with_its_last_line(env):
    root, _, _ = env
    run_ops = RunOps(LocalTransport("local"), local_host(root))
    rd = root / "runs" / "own-20261201-010000-abcdef"
    rd.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "0"])
    dead.wait()
    (rd / "state.json").write_text(json.dumps({"run_id": rd.name, "run_name": "own",
                                               "status": "starting", "pid": dead.pid}))
    (rd / "supervisor.log").write_text("dfo-supervisor: supervisor started (setsid)\n"
                                       "dfo-supervisor: something broke at start\n"
                                       "dfo: supervisor exited 1; restarting it (1/5)\n")
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as e:
        run_ops.wait_started(rd.name, timeout=40)
    assert time.monotonic() - t0 < 20
    assert "exited at start: dfo-supervisor: something broke at start" in str(e.value)


def test_an_own_commands_exit_status_is_its_own_not_the_bundled_trainers(env, capsys):
    """Exit 2 of your own command is not "trainer config error": dfo says the command ended
    with exit 2 and its last line."""
    from orchestrator.common.classify import classify

    root, hosts, tmp = env
    code = "import sys; print(\"can't open file 'x.py'\", file=sys.stderr); sys.exit(2)"
    rc, out, err = dfo(capsys, hosts, "launch", "--no-env-check", "--backoff-scale", "0.01",
                       "--budget", "total=1", "--json", "--", sys.executable, "-c", code)
    assert rc == 0, err
    run_id = json.loads(out)["run_id"]
    wait_final(RunOps(LocalTransport("local"), local_host(root)), run_id, timeout=120)
    cl = [e for e in events(root, run_id) if e.kind == "classified"]
    assert cl and all("trainer config error" not in c.reason for c in cl), cl
    assert cl[0].reason == "the command ended with exit 2: can't open file 'x.py'"
    # the bundled trainer's exit 2 keeps its meaning
    assert classify(["boom"], exit_code=2).reason.startswith("trainer config error")
