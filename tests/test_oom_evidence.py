"""The kernel's OOM killer as evidence: cgroup v2 ``memory.events``, cgroup v1
``memory.oom_control``/``memory.failcnt``, and the kernel's own log naming the attempt's pid.
Parsers on recorded files; a real OOM kill in a real cgroup v1 memory controller where this
machine has one (root); and the real supervisor classing an own command the kernel killed
as ``oom``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from orchestrator.supervisor.policy import oom
from orchestrator.supervisor import procs

FIX = Path(__file__).parent / "fixtures" / "oom"
V1 = "/sys/fs/cgroup/memory"


def kmsg_records() -> list[str]:
    return [ln for ln in (FIX / "kmsg_memcg_oom.txt").read_text().splitlines()
            if not ln.startswith("## ")]


def test_parsers_on_recorded_files():
    assert oom.parse_memory_events((FIX / "v2_memory.events").read_text()) == 2
    assert oom.parse_oom_control((FIX / "v1_memory.oom_control.after").read_text()) == (0, 1)
    assert oom.parse_oom_control("oom_kill_disable 0\nunder_oom 1\n") == (1, None)
    assert oom.parse_memory_events("low 0\n") is None


def test_which_counter_rose():
    b, a = oom.OomCounters(v1_oom_kill=0), oom.OomCounters(v1_oom_kill=1)
    assert "cgroup v1 memory.oom_control oom_kill rose (0 -> 1)" == oom.counters_rose(b, a)
    assert oom.counters_rose(a, a) is None
    assert "v2" in oom.counters_rose(oom.OomCounters(v2_oom_kill=3),
                                     oom.OomCounters(v2_oom_kill=4))
    # failcnt alone: the kernel reclaimed and went on; with under_oom the cgroup is stuck
    assert oom.counters_rose(oom.OomCounters(v1_failcnt=5), oom.OomCounters(v1_failcnt=9)) \
        is None
    assert "under_oom 1" in oom.counters_rose(
        oom.OomCounters(v1_failcnt=5, v1_under_oom=0),
        oom.OomCounters(v1_failcnt=9, v1_under_oom=1))
    # unreadable stays unknown
    assert oom.counters_rose(oom.OomCounters(), oom.OomCounters(v1_oom_kill=1)) is None


def test_kernel_lines_count_only_for_the_attempts_pids():
    got = oom.kernel_oom_kills(kmsg_records(), {2790, 1})
    assert got == ["Memory cgroup out of memory: Killed process 2790 (python3) total-vm:426164kB"
                   ", anon-rss:65280kB, file-rss:6616kB, shmem-rss:0kB, UID:0 pgtables:184kB "
                   "oom_score_adj:0"]
    assert oom.kernel_oom_kills(kmsg_records(), {2791}) == []
    # dmesg's form, and the host-wide OOM killer's wording
    assert oom.kernel_oom_kills(["[12345.678901] Out of memory: Killed process 77 (python) "
                                 "total-vm:1kB"], [77]) == [
        "Out of memory: Killed process 77 (python) total-vm:1kB"]


def test_classify_names_the_kernels_line():
    from orchestrator.common.classify import classify

    line = "the kernel's OOM killer: Memory cgroup out of memory: Killed process 2790 (python3)"
    d = classify(["loading"], exit_code=None, signal=9, oom_killed=True, oom_reason=line)
    assert d.cls == "oom" and d.reason == line


def test_this_machines_own_counters_are_read_for_its_cgroup_version():
    c = procs.oom_counters()
    v2, v1 = procs._cgroups()
    if os.path.exists(f"{V1}/memory.oom_control") and v1 is not None:
        assert c.v1_oom_kill is not None or c.v1_under_oom is not None
    if os.path.exists("/sys/fs/cgroup/memory.events"):
        assert c.v2_oom_kill is not None


@pytest.fixture
def memcg():
    """A fresh cgroup v1 memory controller child with a 64 MiB limit (swap included)."""
    if os.geteuid() != 0:
        pytest.skip("creating a cgroup needs root")
    if not os.path.exists(f"{V1}/memory.oom_control"):
        pytest.skip("no cgroup v1 memory controller is mounted at /sys/fs/cgroup/memory here "
                    "(a cgroup v2 host); the v1 parsers are tested on recorded files")
    kl = procs.KernelLog()
    readable = kl.fd is not None
    kl.close()
    if not readable:
        pytest.skip("the kernel log (/dev/kmsg) cannot be read here")
    d = Path(V1) / f"dfo-test-{uuid.uuid4().hex[:8]}"
    try:
        d.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup under {V1}: {e.strerror}")
    (d / "memory.limit_in_bytes").write_text(str(64 << 20))
    try:
        (d / "memory.memsw.limit_in_bytes").write_text(str(64 << 20))
    except OSError:
        pass   # no swap accounting: the limit alone
    yield d
    for _ in range(100):
        try:
            d.rmdir()
            break
        except OSError:
            subprocess.run(["sleep", "0.1"])


HOG = "x = bytearray(400 << 20); print('allocated', len(x))"


def test_a_real_cgroup_v1_oom_kill_is_seen_in_the_counters_and_the_kernel_log(memcg):
    before = oom.OomCounters(v1_oom_kill=oom.parse_oom_control(
        (memcg / "memory.oom_control").read_text())[1])
    kl = procs.KernelLog()
    p = subprocess.Popen(["sh", "-c", f"echo $$ > {memcg}/cgroup.procs; exec {sys.executable} "
                          f"-c \"{HOG}\""])
    p.wait(timeout=120)
    try:
        lines = oom.kernel_oom_kills(kl.read(), {p.pid})
    finally:
        kl.close()
    assert p.returncode == -9
    after = oom.OomCounters(v1_oom_kill=oom.parse_oom_control(
        (memcg / "memory.oom_control").read_text())[1])
    assert oom.counters_rose(before, after).startswith("cgroup v1 memory.oom_control oom_kill")
    assert len(lines) == 1 and f"Killed process {p.pid} " in lines[0]


def test_the_supervisor_classes_a_kernel_oom_kill_of_its_attempt_as_oom(memcg, tmp_path):
    from orchestrator.engine.runs import LaunchOptions, RunOps
    from orchestrator.common.errors import RunFailed
    from orchestrator.transport.local import LocalTransport
    from tests.supervisor_env import FAST, events, local_host, make_root, wait_final

    root = make_root(tmp_path)
    run_ops = RunOps(LocalTransport("local"), local_host(root))
    cmd = ["sh", "-c", f"echo $$ > {memcg}/cgroup.procs; exec {sys.executable} -c \"{HOG}\""]
    try:
        run_id = run_ops.launch(LaunchOptions(command=cmd, run_name="hog", backoff_scale=0.01,
                                          thresholds=dict(FAST), env_check=False)).run_id
    except RunFailed as e:   # it may end before launch has finished watching its start
        run_id = re.search(r"run (\S+) failed at start", str(e)).group(1)
    info = wait_final(run_ops, run_id, timeout=240)
    cl = [e for e in events(root, run_id) if e.kind == "classified"]
    assert cl and cl[0].cls == "oom", (cl, info.get("reason"))
    assert "Memory cgroup out of memory: Killed process" in cl[0].reason
    assert info["status"] == "failed"
