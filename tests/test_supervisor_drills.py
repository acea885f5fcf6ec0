"""Fault drills, replayed with the real trainer on CPU under the real
supervisor (local transport):

- a busy host (a CPU hog beside the run) drops tokens/s: recorded as ``throughput_low``
  with what the host showed; no SIGTERM, no fallback, no config change;
- a hang is acted on within ``hang_s`` of the heartbeats stopping, not after ``train_s``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from dfo_contract.markers import iter_markers

from tests.supervisor_env import (events, kinds, launch, local_run_ops, wait_final, wait_for,
                                  write_config)

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path, tiny_assets):  # noqa: F811
    return local_run_ops(tmp_path)


def state(root, run_id) -> dict:
    try:
        return json.loads((root / "runs" / run_id / "state.json").read_text())
    except (OSError, ValueError):
        return {}


HOG = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end:\n    pass\n"


MAX_HOGS = 64


def steps(root, run_id) -> list[dict]:
    log = root / "runs" / run_id / "attempt-1.log"
    return [m for m in iter_markers(log.read_text().splitlines()) if m.get("kind") == "step"]


def steps_after(root, run_id, step: int) -> list[dict]:
    return [m for m in steps(root, run_id) if m["step"] > step]


def step_s(marks: list[dict]) -> float:
    """The median time between these step markers (the run's measured step time)."""
    gaps = sorted(b["t"] - a["t"] for a, b in zip(marks, marks[1:], strict=False))
    return gaps[len(gaps) // 2] if gaps else 1.0


def hog_until_slow(root, run_id, hogs: list, cores: int, baseline: float) -> float:
    """Start CPU hogs, doubling them until two steps made under them ran at under 0.3 x the
    baseline (the collapse fraction is 0.5) or a ``throughput_low`` came: on an idle
    2-core box the first 10 do it; a box busy with other sessions needs more. Returns the
    step time under the hogs. Waits are bounded by 10x the step time measured so far."""
    n = 4 * cores + 2
    while True:
        marks = steps(root, run_id)
        slow = 10 * step_s(marks)
        # each hog leads a session of its own: with the kernel's autogroups
        # (sched_autogroup_enabled) CPU time is shared between sessions first, and the run's
        # supervisor leads one; hogs in one session, however many, take only its share
        hogs += [subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True)
                 for _ in range(n - len(hogs))]
        at = marks[-1]["step"]
        # the first step after ``at`` may have started before the hogs: the next two
        def two_under_hogs(at=at):
            got = steps_after(root, run_id, at)
            return got[1:3] if len(got) >= 3 else None

        after = wait_for(two_under_hogs, 3 * slow + 60, f"three steps under {n} hogs")
        if all(m["tokens_per_s"] < 0.3 * baseline for m in after) or n >= MAX_HOGS \
                or kinds(events(root, run_id), "throughput_low"):
            return step_s(steps_after(root, run_id, at))
        n = min(MAX_HOGS, 2 * n)


def test_a_cpu_hog_is_host_busy_not_dense_attention(setup, tiny_assets):  # noqa: F811
    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets, train={"max_steps": 100000},
                       checkpoint={"every": 50})
    plan = launch(run_ops, cfg, thresholds={"train_s": 120, "collapse_steps": 12,
                                        "baseline_steps": 3, "skip_steps": 2})
    hogs: list[subprocess.Popen] = []
    try:
        # (on a 2-core box the standby's imports come first: they are no baseline)
        base = wait_for(lambda: state(root, plan.run_id).get("baseline_tokens_per_s"), 600,
                        "a throughput baseline")
        # the baseline may come from steps read before the standby started (the supervisor
        # reads the log in batches); no step counts as low while it imports (up to
        # IMPORT_PAUSE_MAX_S, and hogs slow its imports too): hog only once it is ready
        wait_for(lambda: kinds(events(root, plan.run_id), "standby_ready")
                 or kinds(events(root, plan.run_id), "standby_discarded"), 600,
                 "the standby's imports to end")
        hogged = hog_until_slow(root, plan.run_id, hogs, os.cpu_count() or 1, base)
        # the bounds below only end a broken run: 12 low steps at up to 3x the step time
        # under the hogs, and the host judgement's seconds after the drop
        slow = 3 * hogged
        low = wait_for(lambda: kinds(events(root, plan.run_id), "throughput_low"),
                       max(240.0, 12 * slow + 60), "a throughput_low event")[0]
        # the run goes on under the hog: nothing is stopped (three more steps after the event)
        at = state(root, plan.run_id).get("last_step") or 0
        wait_for(lambda: (state(root, plan.run_id).get("last_step") or 0) >= at + 3,
                 max(120.0, 3 * slow + 60), "three more steps under the hog")
        st = state(root, plan.run_id)
        assert st["status"] == "running" and st["attempt"] == 1
        # the latest judgement may differ from the first while the hog starts and the host
        # settles (seen on a loaded 2-core CI run: "unknown"); the first one is checked below
        assert st["throughput_low"] is None or st["throughput_low"]["cause"] in ("host_busy", "unknown")
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()
        run_ops.stop(plan.run_id)   # also when an assertion failed: never leave the run going
    info = wait_final(run_ops, plan.run_id)
    evs = events(root, plan.run_id)
    assert low.cause == "host_busy", low
    seen = low.seen     # what the host showed: other processes' cores, or the load
    assert (seen["other_cores"] >= 1.0 and "other processes kept" in low.summary) or \
        (seen["load1"] > seen["cores"] and "load" in low.summary), low
    assert low.seen["gpu_apps"] in ("unknown (no nvidia-smi)", []) or \
        isinstance(low.seen["gpu_apps"], list)
    # the config never changed and no attempt was cut short for it
    assert kinds(evs, "fallback") == [] and kinds(evs, "restart") == []
    assert [e.cls for e in kinds(evs, "classified")] in ([], ["done"])
    assert len(kinds(evs, "attempt_start")) == 1
    assert info["overrides"] == {} and info["status"] == "stopped"
    assert not any("throughput collapse" in e.reason for e in kinds(evs, "watchdog"))


def test_a_hang_is_acted_on_within_hang_s_of_the_last_heartbeat(setup, tiny_assets):  # noqa: F811
    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    # train_s 300 (the default): acting only after train_s would wait 5 minutes
    plan = launch(run_ops, cfg, fault="hang@5", thresholds={"train_s": 300, "hang_s": 10})
    info = wait_final(run_ops, plan.run_id, timeout=280)
    evs = events(root, plan.run_id)
    assert info["status"] == "done", info.get("reason")
    wd = [e for e in kinds(evs, "watchdog") if "without progress" in e.reason]
    assert len(wd) == 1 and "idle" in wd[0].reason and "hang_s 10s" in wd[0].reason
    # the last marker attempt 1 printed (a heartbeat or step), then the watchdog: hang_s
    # plus the sampling, far from train_s
    log1 = (root / "runs" / plan.run_id / "attempt-1.log").read_text().splitlines()
    last = max(json.loads(ln[5:])["t"] for ln in log1 if ln.startswith("@dfo "))
    gap = wd[0].t - last
    assert 10 <= gap < 120, gap
    assert kinds(evs, "stacks") and kinds(evs, "classified")[0].cls == "compile_hang"
    assert info["last_step"] == 12


def test_a_stopped_trainer_is_frozen_not_a_compile_hang(setup, tiny_assets):  # noqa: F811
    """SIGSTOP to attempt 1's trainer (as soon as it started, so it cannot finish first):
    ``frozen`` (its state T read from /proc), not ``compile_hang``; the same config again
    (no compile step in a run that does not compile), and the run ends done."""
    root, run_ops, tmp = setup
    cfg = write_config(tmp / "c.yaml", tiny_assets)
    plan = launch(run_ops, cfg, thresholds={"hang_s": 10, "frozen_s": 3})
    starts = wait_for(lambda: kinds(events(root, plan.run_id), "attempt_start"), 120,
                      "attempt 1 to start")
    pid = starts[0].pid
    os.kill(pid, signal.SIGSTOP)
    info = wait_final(run_ops, plan.run_id, timeout=280)
    evs = events(root, plan.run_id)
    cls = kinds(evs, "classified")
    assert cls[0].cls == "frozen", [(c.cls, c.reason) for c in cls]
    assert f"process {pid} of the attempt stopped (state T" in cls[0].reason
    assert [f.step for f in kinds(evs, "fallback")] == [None]    # the same config again
    assert info["overrides"] == {} and info["status"] == "done", info.get("reason")
    assert not kinds(evs, "stacks")
