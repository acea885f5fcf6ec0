"""`dfo launch -- CMD` whose CMD the host cannot run: refused in one line from launch's one
round trip to the host (exit 2), no run directory, no supervisor, nothing `lost`."""

from __future__ import annotations

import os
import stat

import pytest

from orchestrator.cli import main
from orchestrator.plan.launch_plan import own_command
from tests.supervisor_env import hosts_yaml, make_root


@pytest.fixture
def env(tmp_path):
    root = make_root(tmp_path)
    return root, hosts_yaml(tmp_path / "hosts.yaml", root), tmp_path


def launch(capsys, hosts, *cmd):
    rc = main(["--hosts", str(hosts), "launch", "--no-env-check", "-f", "--", *cmd])
    out = capsys.readouterr()
    return rc, out.out, out.err


def runs(root):
    d = root / "runs"
    return sorted(os.listdir(d)) if d.is_dir() else []


@pytest.mark.parametrize("cmd, says", [
    ("/no/such/trainer", "the command /no/such/trainer is not an executable file on local"),
    ("no-such-trainer-dfo", "the command 'no-such-trainer-dfo' is not found on local"),
])
def test_a_command_the_host_cannot_run_is_refused_with_no_run(capsys, env, cmd, says):
    root, hosts, _ = env
    rc, out, err = launch(capsys, hosts, cmd, "--lr", "1")
    assert rc == 2, (out, err)
    assert says in err and "Traceback" not in err
    assert err.strip().count("\n") <= 1         # one line (and its hint)
    assert runs(root) == []


def test_a_file_that_is_not_executable_is_refused_too(capsys, env):
    root, hosts, tmp = env
    script = tmp / "train.py"
    script.write_text("print('hi')\n")
    script.chmod(script.stat().st_mode & ~(stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH))
    rc, _, err = launch(capsys, hosts, str(script))
    assert rc == 2 and f"{script} is not an executable file" in err
    assert "python PATH" in err and runs(root) == []


def test_relative_paths_are_taken_from_the_commands_directory():
    assert own_command("./train.sh", "/w/runs/r") == "/w/runs/r/train.sh"
    assert own_command("python", "/w") == "python"
