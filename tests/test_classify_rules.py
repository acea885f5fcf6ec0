"""The classifier on recorded real output (tests/fixtures/logs) and on exit information."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from orchestrator.common.classify import (LineScan, ThroughputMonitor, classify, classify_text,
                                       match_line)
from orchestrator.common.classify_rules import CLASSES

FIX = Path(__file__).parent / "fixtures" / "logs"


def fixture_lines(name: str) -> list[str]:
    """The recorded output without its ``## `` provenance header."""
    return [ln for ln in (FIX / name).read_text().splitlines() if not ln.startswith("## ")]


@pytest.mark.parametrize("name, exit_code, cls", [
    ("fx_trace_race_threads.log", 5, "fx_trace_race"),
    ("oom_cuda.log", 1, "oom"),
    ("nccl_watchdog.log", None, "nccl_timeout"),
    ("nccl_watchdog_terminate.log", None, "nccl_timeout"),
    ("dense_flex_warning.log", 5, "dense_fallback"),
    ("recompile_limit.log", 5, "dense_fallback"),
])
def test_recorded_output_is_classified(name, exit_code, cls):
    d = classify(fixture_lines(name), exit_code=exit_code)
    assert d.cls == cls, d
    assert d.evidence, "a class must come with evidence lines"
    for e in d.evidence:
        assert fixture_lines(name)[e.line - 1].startswith(e.text[:50])


def test_fx_error_evidence_is_the_runtime_error_line():
    d = classify(fixture_lines("fx_trace_race_threads.log"), exit_code=5)
    assert d.evidence[0].text.startswith("RuntimeError: Detected that you are using FX")


def test_fx_race_outranks_the_dense_warning_it_causes():
    lines = fixture_lines("dense_flex_warning.log") + fixture_lines("fx_trace_race_threads.log")
    d = classify(lines, exit_code=5)
    assert d.cls == "fx_trace_race"
    assert set(d.also) >= {"fx_trace_race", "dense_fallback"}


def test_done_needs_exit_zero():
    assert classify(["@dfo {\"kind\": \"done\", \"step\": 40}"], exit_code=0).cls == "done"
    # a clean exit wins over warnings printed during the run
    assert classify(fixture_lines("dense_flex_warning.log"), exit_code=0).cls == "done"


def test_hang_is_compile_hang_and_kill_is_not_crash():
    d = classify(["@dfo {\"kind\": \"heartbeat\"}"], exit_code=None, signal=signal.SIGKILL,
                 hang="31s without progress during warm-up/compile (threshold 30s)")
    assert d.cls == "compile_hang" and "threshold" in d.reason


def test_oom_killer_and_plain_sigkill():
    assert classify([], signal=9, oom_killed=True).cls == "oom"
    d = classify(["something"], signal=9)
    assert d.cls == "crash" and "SIGKILL" in d.reason


def test_permanent_exit_codes():
    d = classify(["config: --train.micro_batch: expected a positive integer, got 0"], exit_code=2)
    assert d.cls == "crash" and d.permanent and "config error" in d.reason
    assert d.evidence[-1].text.startswith("config: --train.micro_batch")
    assert not classify(["boom"], exit_code=1).permanent


def test_nan_from_marker_and_text():
    assert classify(['@dfo {"kind": "step", "step": 3, "loss": NaN}'], exit_code=5).cls == "nan_loss"
    assert classify(["RuntimeError: non-finite loss at step 7"], exit_code=5).cls == "nan_loss"
    assert classify(['@dfo {"kind": "step", "step": 3, "loss": 2.5}'], exit_code=1).cls == "crash"


def test_collapse_without_dense_lines_is_not_dense_fallback():
    """A busy host slows training too: a collapse alone names no class."""
    why = "100 tok/s < 0.5 x baseline 1000 tok/s for 5 steps"
    d = classify(["step 40 loss 2.1"], exit_code=6, collapse=why)
    assert d.cls == "crash" and "dense_fallback" not in d.also
    d = classify(["UserWarning: ... materializes the full scores matrix ..."], exit_code=6,
                 collapse=why)
    assert d.cls == "dense_fallback" and "throughput collapse" in d.reason


@pytest.mark.parametrize("line", [
    "step 12 loss 3.2 tok/s 1234",
    "loading checkpoint step_20",
    "NCCL_NVLS_ENABLE=0",
    "inference mode on",
    "compile.gate: true",
])
def test_ordinary_lines_match_nothing(line):
    assert match_line(line) is None


def test_offline_log_without_pattern():
    d = classify_text("hello\nworld\n")
    assert d.cls == "crash" and d.exit_code is None


def test_incremental_scan_equals_batch():
    lines = fixture_lines("fx_trace_race_threads.log")
    scan = LineScan()
    for ln in lines:
        scan.feed(ln)
    assert classify(scan, exit_code=5).cls == classify(lines, exit_code=5).cls


def test_classes_cover_the_issue():
    assert set(CLASSES) == {"fx_trace_race", "compile_hang", "dense_fallback", "oom",
                            "nccl_timeout", "nan_loss", "frozen", "disk_full", "crash", "done",
                            "compile_resources", "compile_workers", "warmup_collective",
                            "compile_error", "read_only"}


DISK_FULL_LINE = ("trainer: disk full: the filesystem at /mnt/ck is full (12.0 KiB free); "
                  "checkpoint step_50 in /mnt/ck/r needs 1.5 GiB (free space there or set "
                  "checkpoint.dir to a larger filesystem, then resume)")


def test_a_full_disk_is_its_own_permanent_class_named_by_the_trainers_line():
    d = classify(["@dfo {\"kind\": \"step\", \"step\": 50}", DISK_FULL_LINE], exit_code=7)
    assert d.cls == "disk_full" and d.permanent
    assert d.reason == DISK_FULL_LINE[len("trainer: "):]
    # ENOSPC anywhere else (a traceback of a metrics write): the same class, also over a
    # crash-looking exit and beside another class's evidence
    tb = ["Traceback (most recent call last):", "OSError: [Errno 28] No space left on device",
          "Detected that you are using FX to symbolically trace a dynamo-optimized function"]
    d = classify(tb, exit_code=5)
    assert d.cls == "disk_full" and d.permanent and "fx_trace_race" in d.also
    assert d.reason == "no-space-left in the output"
    # the exit code alone (the log was lost)
    d = classify([], exit_code=7)
    assert d.cls == "disk_full" and d.permanent
    # a full-disk line is no reason to kill a running attempt: its end decides
    assert LineScan().feed("OSError: [Errno 122] Disk quota exceeded").live is False


def test_throughput_monitor():
    m = ThroughputMonitor(fraction=0.5, steps=3, baseline_steps=3, skip_steps=1)
    seq = [10, 1000, 1100, 900] + [1000] * 3
    assert all(m.observe(x) is None for x in seq)
    assert m.baseline == 1000
    assert m.observe(400) is None and m.observe(400) is None
    assert m.observe(1000) is None            # one healthy step resets the count
    assert m.observe(400) is None and m.observe(400) is None
    why = m.observe(300)
    assert why and "baseline 1000" in why
    assert ThroughputMonitor().observe(float("nan")) is None


def test_throughput_monitor_paused_takes_no_baseline_and_counts_no_low_step():
    # the CI case: the standby's imports slowed steps 4-8 to ~1000 tok/s; a baseline taken
    # then (3088) hid a later collapse under a CPU hog
    m = ThroughputMonitor(fraction=0.5, steps=2, baseline_steps=3, skip_steps=2)
    assert m.observe(9000) is None and m.observe(11000) is None   # skipped
    m.paused = True
    assert all(m.observe(x) is None for x in (800, 1000, 900, 850))
    assert m.baseline is None
    m.paused = False
    assert all(m.observe(x) is None for x in (11000, 12000, 11500))
    assert m.baseline == 11500
    m.paused = True
    assert m.observe(100) is None and m.observe(100) is None and m.observe(100) is None
    assert m.low_steps == 0
    m.paused = False
    assert m.observe(3000) is None
    assert "baseline 11500" in m.observe(3000)
