"""`dfo logs` and the far side: ``logs -f`` on a run that never started ends with
exit 10; no follower outlives its client (closed pipe, dead parent); an env without dfo in
it is exit 7 "run `dfo deploy`" for status, logs and stop. Real processes throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.common.errors import DeployError
from orchestrator.supervisor import procs
from orchestrator.supervisor.query import never_started
from tests.supervisor_env import REPO, dfo, hosts_yaml, live_looking_run, make_root, wait_for

CLI = "import sys; from orchestrator.cli import main; sys.exit(main(sys.argv[1:]))"


def dfo_proc(hosts, *args, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", CLI, "--hosts", str(hosts), *args],
                          capture_output=True, text=True, cwd=str(REPO), env=env,
                          timeout=timeout)


@pytest.fixture
def env(tmp_path):
    root = make_root(tmp_path)
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    return root, hosts, tmp_path


# --- logs -f on a run that never started; followers die with their client ---------------------

def _cut_off_run_dir(root: Path, run_id: str, age_s: float = 120) -> Path:
    """What a launch cut off before its supervisor started leaves: spec.json, no state.json."""
    rd = root / "runs" / run_id
    rd.mkdir(parents=True)
    (rd / "config.yaml").write_text("train: {}\n")
    (rd / "spec.json").write_text(json.dumps({"run_id": run_id}))
    old = time.time() - age_s
    for p in (rd / "config.yaml", rd / "spec.json", rd):
        os.utime(p, (old, old))
    return rd


def test_logs_follow_on_a_run_that_never_started_ends(env):
    root, hosts, tmp = env
    rd = _cut_off_run_dir(root, "ghost-20260101-000000-abcdef")
    p = dfo_proc(hosts, "logs", "-f", "--run", rd.name, timeout=120)   # before: never ended
    assert p.returncode == 10, (p.stdout, p.stderr)
    assert "never started" in p.stderr and str(rd) in p.stderr and p.stderr.count("\n") == 1
    assert never_started(str(rd))
    p = dfo_proc(hosts, "status", "--json")
    assert json.loads(p.stdout)["runs"][0]["shown_status"] == "never_started"


def test_a_fresh_or_busy_run_dir_is_not_never_started(env):
    root, _, _ = env
    rd = _cut_off_run_dir(root, "fresh-1", age_s=0)
    assert not never_started(str(rd))           # a launch may still be writing it
    old = _cut_off_run_dir(root, "busy-1")
    # a process working on it (launch seeding its cache, a supervisor starting)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                          str(old / "cache")])
    try:
        wait_for(lambda: str(old / "cache") in procs.cmdline(p.pid), 30, "the process to start")
        assert not never_started(str(old))
    finally:
        p.kill()
        p.wait()
    assert never_started(str(old))


@pytest.fixture
def live_run(env):
    """A run whose state says running, its pid a live stand-in of its supervisor:
    followers never end by themselves."""
    root, _, _ = env
    rd = root / "runs" / "live-1"
    sup = live_looking_run(rd)
    yield rd
    sup.kill()
    sup.wait()


def _follower_argv(rd: Path) -> list[str]:
    return [sys.executable, "-m", "orchestrator.supervisor.follow", "--run-dir", str(rd),
            "--follow", "--poll", "0.05"]


def test_follower_exits_when_its_pipe_closes(live_run):
    rd = live_run
    p = subprocess.Popen(_follower_argv(rd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        first = p.stdout.readline()
        assert b'"f":"events.jsonl"' in first
        p.stdout.close()            # the client is gone (SSH channel / pct exec closed)
        assert p.wait(timeout=60) == 0
        assert b"Traceback" not in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_follower_exits_when_its_parent_dies(live_run, tmp_path):
    rd = live_run
    out = tmp_path / "follow.out"
    # the parent keeps nothing open to read; the follower writes to a file: only the
    # parent's death can tell it that its client is gone
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         f"p = subprocess.Popen({_follower_argv(rd)!r}, stdout=open({str(out)!r}, 'w'))\n"
         "print(p.pid, flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)))
    child = int(parent.stdout.readline())
    try:
        wait_for(lambda: out.exists() and out.stat().st_size > 0, 60, "the follower's first line")
        parent.kill()
        parent.wait()
        wait_for(lambda: not procs.alive(child), 60, "the orphaned follower to exit")
    finally:
        if procs.alive(child):
            os.kill(child, signal.SIGKILL)


# --- an env without dfo in it: exit 7, "run dfo deploy", for every command ---------------------

def test_env_without_dfo_is_exit_7_for_status_and_logs(tmp_path, capsys):
    """envs/current whose python cannot import dfo (a killed `deploy --force`)."""
    root = tmp_path / "root"
    bin_ = root / "envs" / "current" / "bin"
    bin_.mkdir(parents=True)
    py = bin_ / "python"
    # isolated, without site-packages: `-m orchestrator...` -> No module named 'orchestrator'
    py.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    py.chmod(0o755)
    _cut_off_run_dir(root, "r-1")
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    for args in (["status"], ["logs", "--run", "r-1"], ["logs", "-f", "--run", "r-1"],
                 ["logs"], ["stop", "--run", "r-1"]):
        rc, _, err = dfo(capsys, hosts, *args)
        assert rc == 7, (args, err)
        assert "No module named 'orchestrator'" in err and "run `dfo deploy`" in err, args
        assert err.count("\n") == 1


def test_env_error_is_only_for_dfo_modules_in_the_env():
    from orchestrator.transport.base import Result, env_error

    py = "/r/envs/current/bin/python"
    err = "python: Error while finding module specification for 'orchestrator.x' " \
          "(ModuleNotFoundError: No module named 'orchestrator')"
    e = env_error([py, "-m", "orchestrator.supervisor.query"], 1, err)
    assert isinstance(e, DeployError) and e.exit_code == 7
    assert "No module named 'orchestrator'" in str(e) and "run `dfo deploy`" in str(e)
    assert env_error([py, "-m", "trainer.core.checkpoints"], 127, "") is not None
    assert env_error(["/usr/bin/python3", "-m", "orchestrator.x"], 1, err) is None
    assert env_error([py, "-m", "orchestrator.x"], 0, err) is None
    assert env_error([py, "-m", "orchestrator.x"], 1, "ValueError: bad") is None
    with pytest.raises(DeployError):
        Result((py, "-m", "orchestrator.supervisor.query"), 1, b"", err.encode()).check()
