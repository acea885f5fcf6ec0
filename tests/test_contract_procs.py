"""dfo_contract.procs: the one /proc/PID/stat reader and the one "is it still that process"
rule, on real processes. A reused pid is one whose number is live but whose start time or
command line is another process's: it is never taken for the recorded one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from dfo_contract import procs
from tests.supervisor_env import REPO, supervisor_stand_in, wait_for


def _stat_line(comm: str, state: str = "S", ppid: int = 1, start: int = 4242) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice threads itrealvalue starttime ...
    return (f"123 ({comm}) {state} {ppid} 5 6 0 -1 4194304 10 0 0 0 "
            f"7 3 2 1 20 0 1 0 {start} 1000 200 18446744073709551615")


def test_parse_stat_counts_fields_after_the_last_paren():
    st = procs.parse_stat(_stat_line("a b) c", state="Z", ppid=77, start=999))
    assert st == procs.ProcStat(state="Z", ppid=77, utime=7, stime=3, cutime=2, cstime=1,
                                start=999)
    assert st.zombie and st.cpu_ticks == 13
    assert procs.parse_stat(_stat_line("x").encode()).start == 4242
    assert procs.parse_stat("garbage") is None and procs.parse_stat(b"1 (x) S") is None


def test_proc_stat_of_this_process_and_a_gone_one():
    me = procs.proc_stat(os.getpid())
    assert me is not None and me.ppid == os.getppid() and me.state in "RS"
    assert procs.process_start("self") == me.start == procs.process_start(os.getpid())
    tid = str(os.getpid())      # the main thread (tids need not sort: they wrap around)
    assert tid in os.listdir(f"/proc/{os.getpid()}/task")
    assert procs.proc_stat(os.getpid(), task=tid).start == me.start
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert procs.proc_stat(p.pid) is None and procs.process_start(p.pid) is None
    assert not procs.alive(p.pid) and procs.cmdline(p.pid) == []


def test_a_zombie_is_not_alive():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_for(lambda: getattr(procs.proc_stat(p.pid), "zombie", False), 60,
                 "the child to exit unreaped")
        assert procs.pid_alive(p.pid)                # the pid still exists ...
        assert not procs.alive(p.pid)                # ... but no process runs there
        assert not procs.same_process(p.pid, procs.proc_stat(p.pid).start)
    finally:
        p.wait()


def test_same_process_detects_pid_reuse():
    """The record holds (pid, start time). The same number with another start time is
    what a reused pid looks like: another process, so the recorded one is gone."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        start = procs.process_start(p.pid)
        assert start is not None and procs.same_process(p.pid, start)
        assert not procs.same_process(p.pid, start + 1)      # pid reused by a later process
        assert not procs.same_process(p.pid, start - 1)
        assert not procs.same_process(p.pid, None) and not procs.same_process(str(p.pid), start)
        assert not procs.same_process(True, start)
    finally:
        p.kill()
        p.wait()
    assert not procs.same_process(p.pid, start)                 # exited


def test_supervisor_alive_needs_the_supervisors_command_line(tmp_path):
    """state.json's pid belongs to a live process that is not this run's supervisor (its
    pid was reused, or another run's supervisor): not alive. The stand-in whose command
    line is `-m orchestrator.supervisor --run-dir DIR` is."""
    rd, other = tmp_path / "runs" / "r1", tmp_path / "runs" / "r2"
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    sup = supervisor_stand_in(rd)
    try:
        wait_for(lambda: str(rd) in procs.cmdline(sup.pid), 60, "the stand-in to start")
        assert procs.alive(stranger.pid)
        assert not procs.supervisor_alive(str(rd), stranger.pid)   # a reused pid
        assert procs.supervisor_alive(str(rd), sup.pid)
        assert not procs.supervisor_alive(str(other), sup.pid)     # another run's supervisor
        assert not procs.supervisor_alive(str(rd), None)
        assert not procs.supervisor_alive(str(rd), str(sup.pid))
    finally:
        for q in (stranger, sup):
            q.kill()
            q.wait()
    assert not procs.supervisor_alive(str(rd), sup.pid)


def test_follower_ends_lost_when_the_supervisors_pid_is_reused(tmp_path):
    """`dfo logs -f` on a run whose state.json says running with a pid that now belongs to
    another process: the follower ends with `lost` (a pid alone would follow forever)."""
    rd = tmp_path / "runs" / "r1"
    rd.mkdir(parents=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (rd / "state.json").write_text(json.dumps({
            "run_id": "r1", "run_name": "r", "status": "running", "pid": stranger.pid,
            "attempt": 1}))
        (rd / "events.jsonl").write_text('{"kind": "supervisor_start", "t": 1}\n')
        out = subprocess.run([sys.executable, "-m", "orchestrator.supervisor.follow",
                              "--run-dir", str(rd), "--follow", "--poll", "0.05",
                              "--lost-after", "0.5"],
                             capture_output=True, text=True, timeout=120, cwd=str(REPO),
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert procs.alive(stranger.pid), "the stranger outlived the follow"
    finally:
        stranger.kill()
        stranger.wait()
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {"end": "lost"}
