"""The main job's longest step as a person meets it: `dfo launch -f` with the default config
right after the demo's assets exist, from another directory, in a real terminal (tmux, 80
columns) and through a pipe (steady timestamped lines, each checkpoint once). Real trainer
on CPU, local transport."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from orchestrator.config.runconfig import demo_paths
from orchestrator.config.host_tree import HostTree
from tests.supervisor_env import hosts_yaml, make_root  # noqa: F401
from tests.test_tmux_cli import REPO, Tmux

pytestmark = pytest.mark.slow

# the default config is the demo's; compile and the held-out evaluation off keep it short
ARGS = ["launch", "--no-env-check", "-f", "--backoff-scale", "0.01", "--set", "train.max_steps=16",
        "--set", "checkpoint.every=8", "--set", "train.log_every=8",
        "--set", "compile.enabled=false", "--set", "eval.every=0"]


@pytest.fixture
def demo_host(tmp_path, tiny_assets):  # noqa: F811
    root = make_root(tmp_path)
    p = demo_paths(HostTree(str(root)))   # where `dfo demo` puts its assets
    shutil.copytree(tiny_assets / "target", p["target"])
    shutil.copy(tiny_assets / "synth.jsonl", p["data"])
    shutil.copy(tiny_assets / "synth.jsonl", p["eval"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return root, hosts_yaml(tmp_path / "hosts.yaml", root), elsewhere


def test_launch_follow_through_a_pipe(demo_host):
    root, hosts, cwd = demo_host
    cmd = " ".join([sys.executable, "-m", "orchestrator.cli", "--hosts", str(hosts), *ARGS])
    r = subprocess.run(f"{cmd} 2>&1 | cat; exit ${{PIPESTATUS[0]}}", shell=True, executable="/bin/bash",
                       capture_output=True, text=True, cwd=cwd, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(REPO), DFO_PROGRESS_EVERY="1"))
    out = r.stdout
    assert r.returncode == 0, out
    assert re.search(r"launched demo-\d{8}-\d{6}-[0-9a-f]{6} on local", out)
    # each trainer checkpoint line once; a paced "a1│ alive: checkpoint step 8" line of a quiet
    # stretch is the heartbeat, not a repeat of the trainer's line
    for step in (8, 16):
        assert len(re.findall(rf"^(?:\d\d:\d\d:\d\d )?a1│ checkpoint step {step}$", out, re.M)) == 1, out
    # timestamped event lines (the paced "alive" lines of quiet stretches are covered by
    # test_cli_surface's follow test: a 16-step tiny run may have no quiet stretch at all)
    assert re.search(r"^\d\d:\d\d:\d\d ▶ attempt 1 started", out, re.M), out
    assert re.search(r"run demo-\S+ done", out) and "\x1b[" not in out


def test_launch_follow_in_a_terminal(demo_host):
    root, hosts, cwd = demo_host
    t = Tmux(80, 60)
    try:
        t.type(f"cd {cwd}; " + " ".join(["python", "-m", "orchestrator.cli", "--hosts", str(hosts),
                                          *ARGS]) + "; echo rc=$?")
        s = t.wait_for("rc=", 600)
    finally:
        t.close()
    assert "rc=0" in s, s
    assert s.count("checkpoint step 16") == 1 and "done at step 16" in s
    assert "alive:" not in s          # a terminal shows the trainer's own lines, no filler
