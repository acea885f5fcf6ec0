"""dfo as a person meets it: typed into a real terminal (tmux at 80 and 100 columns,
send-keys to type, capture-pane to read the screen) and through a pipe."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dfo_contract.state_records import CheckpointRef, FallbackRecord
from dfo_contract.runstate import Attempt, RunState
from orchestrator.supervisor.runfiles import write_state
from tests.supervisor_env import hosts_yaml, make_root, supervisor_stand_in

REPO = Path(__file__).resolve().parents[1]
RUN = "tiny-cpu-20261201-031500"

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (scripts/test.sh installs it)")


class Tmux:
    """One tmux server of its own (socket), one window of ``width`` x ``height``."""

    def __init__(self, width: int, height: int = 40):
        self.sock = f"dfo-test-{uuid.uuid4().hex[:8]}"
        env = f"PYTHONPATH={REPO} PATH={os.path.dirname(sys.executable)}:/usr/bin:/bin TERM=xterm-256color PS1=ready\\$' '"
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height),
                   f"env -i HOME={os.environ.get('HOME', '/root')} {env} bash --norc --noprofile")
        self.wait_for("ready$", 30)

    def _tmux(self, *args) -> str:
        return subprocess.run(["tmux", "-L", self.sock, "-f", "/dev/null", *args], check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def type(self, line: str) -> None:
        self._tmux("send-keys", "-t", "t", "-l", line)
        self._tmux("send-keys", "-t", "t", "Enter")

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-J", "-t", "t")   # -J: wrapped lines joined

    def wait_for(self, text: str, timeout: float = 120, count: int = 1) -> str:
        """The screen once ``text`` is on it (``rc=`` means the exit status line ``rc=N``,
        not the typed ``echo rc=$?``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.screen()
            hits = len(re.findall(r"rc=\d", s)) if text == "rc=" else s.count(text)
            if hits >= count:
                return s
            time.sleep(0.2)
        raise AssertionError(f"{text!r} not on screen within {timeout}s:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def host(tmp_path):
    root = make_root(tmp_path)
    hosts = hosts_yaml(tmp_path / "hosts.yaml", root)
    return root, hosts


def write_run(root: Path, *, status="done", step=100, pid=None, fallbacks=2) -> Path:
    rd = root / "runs" / RUN
    rd.mkdir(parents=True, exist_ok=True)
    st = RunState.new(RUN, "tiny-cpu", now=time.time() - 300)
    st.status, st.last_step, st.tokens_per_s, st.pid = status, step, 1234.5, pid
    st.attempts = [Attempt(n=1, started_at=time.time() - 300), Attempt(n=2, started_at=time.time() - 200)]
    st.attempt = 2
    st.fallbacks = [FallbackRecord(cls="fx_trace", step="compile_gate", attempt=1),
                    FallbackRecord(cls="oom", step="halve_micro_batch", attempt=2)][:fallbacks]
    st.last_checkpoint = CheckpointRef(step=110, path=f"{root}/checkpoints/tiny-cpu/step_110")
    st.last_event = f"checkpoint step 110 at {root}/checkpoints/tiny-cpu/step_110"
    write_state(str(rd), st)
    (rd / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "tokens_per_s": 1000 + (s * 7) % 300}) + "\n" for s in range(10, 111, 10)))
    return rd


def dfo_cmd(hosts: Path, *args: str) -> str:
    return " ".join(["python", "-m", "orchestrator.cli", "--hosts", str(hosts), *args])


@pytest.mark.parametrize("width", [80, 100])
def test_status_is_readable_at_80_and_100_columns(host, width):
    root, hosts = host
    write_run(root)
    t = Tmux(width)
    try:
        t.type(dfo_cmd(hosts, "status") + "; echo rc=$?")
        s = t.wait_for("rc=")
    finally:
        t.close()
    assert "rc=0" in s
    assert all(len(ln) <= width for ln in s.splitlines() if not ln.startswith("ready$"))
    assert "…" not in s
    row = next(ln for ln in s.splitlines() if RUN in ln)   # the run id whole, on one line
    for cell in ("done", "110", "1234", "compile_gate"):     # step from metrics/checkpoint
        assert cell in row, (cell, s)
    assert "halve_micro_batch" in s                            # each fallback whole
    assert any(ch in row for ch in "▁▂▃▄▅▆▇█")                 # the throughput trend
    if width >= 100:
        assert "step_110" in row and "checkpoint" in s


def test_a_failed_runs_reason_is_whole_at_80_columns(host):
    root, hosts = host
    rd = write_run(root, status="failed")
    st = json.loads((rd / "state.json").read_text())
    reason = ("oom: CUDA out of memory while allocating 2.00 GiB on cuda:0 after the fallback "
              "ladder halve_micro_batch was used up (budget 3/3)")
    st["reason"] = reason
    (rd / "state.json").write_text(json.dumps(st))
    t = Tmux(80)
    try:
        t.type(dfo_cmd(hosts, "status") + "; echo rc=$?")
        s = t.wait_for("rc=")
    finally:
        t.close()
    assert "rc=0" in s and "…" not in s
    assert f"run {RUN} failed: {reason}" in " ".join(s.split()), s


def test_status_wide_and_usage_errors_in_a_terminal(host):
    root, hosts = host
    write_run(root)
    t = Tmux(80)
    try:
        t.type(dfo_cmd(hosts, "status", "--bogus") + "; echo rc=$?")
        s = t.wait_for("rc=")
        assert "rc=2" in s and "Usage:" not in s
        err = [ln for ln in s.splitlines() if ln.startswith("dfo: error:")]
        assert len(err) == 1 and "no such option '--bogus'" in err[0]
        t.type("clear; " + dfo_cmd(hosts, "status", "--wide") + "; echo rc=$?")
        s = t.wait_for("rc=0")
        assert "uptime" in s and "last event" in s   # every column, at its natural width
        row = next(ln for ln in s.splitlines() if RUN in ln)
        assert f"{root}/checkpoints/tiny-cpu/step_110" in row and "…" not in s
    finally:
        t.close()


def test_status_watch_refreshes_in_place_until_the_run_ends(host):
    root, hosts = host
    rd = write_run(root, status="running", step=100, fallbacks=1)
    sup = supervisor_stand_in(rd)
    t = Tmux(100)
    try:
        write_run(root, status="running", step=100, pid=sup.pid, fallbacks=1)
        t.type(dfo_cmd(hosts, "status", "--watch", "--interval", "0.3") + "; echo rc=$?")
        t.wait_for("running", 60)
        with open(rd / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": 130, "tokens_per_s": 2000}) + "\n")
        t.wait_for("130", 60)
        write_run(root, status="done", step=130, pid=sup.pid, fallbacks=2)
        s = t.wait_for("rc=", 60)
    finally:
        t.close()
        sup.kill()
        sup.wait()
    assert "rc=0" in s
    assert s.count("runs on local") == 1, s     # one table, redrawn in place
    assert "done" in s and "running" not in s and "halve_micro_batch" in s


def test_status_watch_in_a_pipe_prints_a_line_per_change(host):
    root, hosts = host
    rd = write_run(root, status="running", step=100, fallbacks=1)
    sup = supervisor_stand_in(rd)
    write_run(root, status="running", step=100, pid=sup.pid, fallbacks=1)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "--hosts", str(hosts), "status",
                          "--watch", "--interval", "0.3"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = p.stdout.readline()
        assert "state=running" in first and "step=110" in first and first[2] == ":"
        write_run(root, status="done", step=130, pid=sup.pid, fallbacks=2)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
        sup.kill()
        sup.wait()
    lines = [first, *out.splitlines()]
    assert p.returncode == 0, err
    assert "state=done" in lines[-1] and "fallback=compile_gate, halve_micro_batch" in lines[-1]
    assert len(lines) == len(set(lines))   # a line per change, none repeated


def test_status_in_a_pipe_is_whole(host):
    root, hosts = host
    write_run(root)
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="80")
    r = subprocess.run(f"{sys.executable} -m orchestrator.cli --hosts {hosts} status | cat",
                       shell=True, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    row = next(ln for ln in r.stdout.splitlines() if RUN in ln)
    assert f"{root}/checkpoints/tiny-cpu/step_110" in row      # the path whole, one line
    assert "compile_gate, halve_micro_batch" in row and "…" not in r.stdout
    assert "\x1b[" not in r.stdout
