"""The pure watchdog (orchestrator.supervisor.policy.watchdog): lines and a fake clock in, actions out.
No processes, no files, no sleeping."""

from __future__ import annotations

import json

from dfo_contract.trainer_markers import CheckpointMarker, EvalMarker
from orchestrator.supervisor.policy.watchdog import (AttemptWatchdog, DumpStacks, Kill, StepProgress,
                                       Terminate, Thresholds, Warn)

T = Thresholds(warmup_s=100, train_s=10, live_grace_s=5, kill_grace_s=3, stop_timeout_s=40,
               collapse_fraction=0.5, collapse_steps=3, baseline_steps=3, skip_steps=1)


def step(n: int, tps: float = 1000.0, loss: float = 1.0) -> str:
    return "@dfo " + json.dumps({"kind": "step", "step": n, "tokens_per_s": tps, "loss": loss})


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_quiet_attempt_needs_nothing():
    w = AttemptWatchdog(T, now=0.0)
    assert w.feed("loading the target model", 1.0) == []
    assert w.tick(50.0) == [] and not w.reached_train and w.hang is None


def test_no_progress_during_warmup_dumps_stacks_then_kills_once():
    w = AttemptWatchdog(T, now=0.0)
    assert w.tick(100.0) == []                 # at the threshold: not yet
    acts = w.tick(100.5)
    assert kinds(acts) == ["Warn", "DumpStacks", "Kill"]
    assert "warm-up/compile" in w.hang and "threshold 100s" in w.hang
    assert acts[0] == Warn(w.hang) and acts[1] == DumpStacks(w.hang)
    assert w.tick(101.0) == []                 # the kill is repeated every 2s, not every poll
    assert kinds(w.tick(102.6)) == ["Kill"]


def test_training_uses_the_train_threshold_and_markers_are_progress():
    w = AttemptWatchdog(T, now=0.0)
    acts = w.feed(step(1), 50.0)
    assert acts == [StepProgress(1, 1000.0, None)] and w.reached_train
    assert w.tick(59.0) == []
    w.feed('@dfo {"kind": "heartbeat"}', 59.0)  # any marker is progress
    assert w.tick(68.0) == []
    acts = w.tick(69.5)
    assert kinds(acts) == ["Warn", "DumpStacks", "Kill"] and "during training" in w.hang
    assert w.healthy_s(70.0) == 20.0


def test_checkpoint_marker():
    w = AttemptWatchdog(T, now=0.0)
    acts = w.feed('@dfo {"kind": "checkpoint", "step": 4, "path": "/c/step_4"}', 1.0)
    assert acts == [CheckpointMarker(step=4, path="/c/step_4")]


def test_eval_marker_carries_the_measured_acceptance_length():
    w = AttemptWatchdog(T, now=0.0)
    line = "@dfo " + json.dumps({"kind": "eval", "step": 40, "accept_len": 2.95,
                                 "best_accept_len": 3.1, "eval_blocks": 64})
    assert w.feed(line, 1.0) == [EvalMarker(step=40, accept_len=2.95, best_accept_len=3.1,
                                            eval_blocks=64, phase=None)]


def test_live_rule_warns_then_terminates_after_grace_then_kills():
    w = AttemptWatchdog(T, now=0.0)
    acts = w.feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", 10.0)
    assert kinds(acts) == ["Warn"] and "oom" in acts[0].reason
    assert w.feed("torch.OutOfMemoryError again", 11.0) == []   # acted on once
    assert w.tick(14.9) == []
    assert kinds(w.tick(15.0)) == ["Terminate"]
    assert w.tick(17.9) == []                                    # kill_grace_s = 3
    assert kinds(w.tick(18.0)) == ["Kill"]
    assert w.hang is None and "oom" in w.scan.hits


def test_dense_fallback_is_acted_on_at_once_with_the_stop_timeout():
    w = AttemptWatchdog(T, now=0.0)
    acts = w.feed("UserWarning: this materializes the full scores matrix", 5.0)
    assert kinds(acts) == ["Warn"]
    assert kinds(w.tick(5.0)) == ["Terminate"]
    assert w.tick(44.9) == [] and kinds(w.tick(45.0)) == ["Kill"]


def test_dense_fallback_expected_for_uncompiled_flex():
    w = AttemptWatchdog(T, now=0.0, dense_expected=True)
    assert w.feed("this materializes the full scores matrix", 5.0) == []
    assert w.tick(6.0) == [] and "dense_fallback" in w.scan.hits


def test_throughput_collapse_without_dense_evidence_is_reported_not_acted_on():
    """A busy host is not dense attention: no SIGTERM, no kill, just a report (and its end)."""
    w = AttemptWatchdog(T, now=0.0)
    w.feed(step(1, 50.0), 1.0)                                   # skipped (compile)
    for i, tps in enumerate((1000.0, 1100.0, 900.0), start=2):
        acts = w.feed(step(i, tps), float(i))
    assert acts[-1] == StepProgress(4, 900.0, 1000.0)                     # the median
    assert w.feed(step(5, 100.0), 5.0) == [StepProgress(5, 100.0, 1000.0)]
    w.feed(step(6, 100.0), 6.0)
    acts = w.feed(step(7, 100.0), 7.0)
    assert kinds(acts) == ["ThroughputDrop", "StepProgress"]
    assert "< 0.5 x baseline" in acts[0].reason
    assert w.feed(step(8, 100.0), 8.0) == [StepProgress(8, 100.0, 1000.0)]   # reported once
    for t in (8.0, 8.5, 9.0):                                     # no SIGTERM, no kill
        assert w.tick(t) == []
    assert kinds(w.feed(step(9, 1000.0), 9.0)) == ["ThroughputBack", "StepProgress"]
    assert w.low is None and w.hang is None and w.term_at is None and w.kill_at is None
    for i in range(10, 13):                                       # a second episode
        acts = w.feed(step(i, 100.0), float(i))
    assert kinds(acts) == ["ThroughputDrop", "StepProgress"] and w.low_episodes == 2
    assert w.healthy_s(50.0) == 49.0                              # still healthy training


def test_collapse_with_expected_dense_lines_is_still_only_reported():
    w = AttemptWatchdog(T, now=0.0, baseline=1000.0, dense_expected=True)
    assert w.feed("this materializes the full scores matrix", 0.5) == []
    for i in range(1, 4):
        acts = w.feed(step(i, 10.0), float(i))
    assert kinds(acts) == ["ThroughputDrop", "StepProgress"]
    assert kinds(w.tick(4.0)) == []


def test_dense_line_then_collapse_terminates_once_for_the_line():
    w = AttemptWatchdog(T, now=0.0, baseline=1000.0)
    assert kinds(w.feed("UserWarning: this materializes the full scores matrix", 0.5)) == ["Warn"]
    assert kinds(w.tick(0.5)) == ["Terminate"]
    for i in range(1, 4):
        acts = w.feed(step(i, 10.0), float(i))
    assert kinds(acts) == ["StepProgress"]                                # no second action


def test_a_known_baseline_is_used_from_the_first_step():
    w = AttemptWatchdog(T, now=0.0, baseline=1000.0)
    for i in range(1, 4):
        acts = w.feed(step(i, 10.0), float(i))
    assert kinds(acts) == ["ThroughputDrop", "StepProgress"]


def test_stop_terminates_and_kills_after_the_stop_timeout():
    w = AttemptWatchdog(T, now=0.0)
    assert w.stop(1.0) == [Terminate("stop requested")] and w.stopping
    assert w.stop(2.0) == []
    assert w.tick(40.9) == []                                     # no hang while stopping
    assert kinds(w.tick(41.0)) == ["Kill"] and w.hang is None
    # a fatal line while stopping changes nothing
    assert w.feed("CUDA out of memory", 42.0) == []


def test_nan_loss_marker_is_live():
    w = AttemptWatchdog(T, now=0.0)
    acts = w.feed(step(3, loss=float("nan")), 1.0)
    assert kinds(acts) == ["StepProgress", "Warn"] and "nan_loss" in acts[1].reason


def test_actions_are_values():
    assert Kill("x") == Kill("x") and Terminate("a") != Terminate("b")


# --- hangs: heartbeats stopped and the process tree idle -----------------------------------

H = Thresholds(warmup_s=900, train_s=300, live_grace_s=5, kill_grace_s=3, stop_timeout_s=40,
               hang_s=60)
BEAT = '@dfo {"kind": "heartbeat", "phase": "compile", "step": 0}'


def run_clock(w, until, *, cpu_per_s, beat_every=None, start=0.0, cpu0=0.0, io_per_s=0):
    """Advance a fake clock in 1 s ticks: the tree uses ``cpu_per_s`` cores, the trainer
    beats every ``beat_every`` s. Returns (the first non-empty tick's actions, its time)."""
    t, cpu, io = start, cpu0, 0
    while t < until:
        t += 1.0
        cpu += cpu_per_s
        io += io_per_s
        if beat_every and int(t) % beat_every == 0:
            w.feed(BEAT, t)
        w.activity(t, cpu, io)
        acts = w.tick(t)
        if acts:
            return acts, t
    return [], t


def test_a_compile_that_beats_is_never_killed_even_for_an_hour():
    w = AttemptWatchdog(H, now=0.0)
    acts, _ = run_clock(w, 3600, cpu_per_s=1.0, beat_every=5)
    assert acts == [] and w.hang is None


def test_heartbeats_stop_and_the_tree_idles_killed_within_hang_s():
    w = AttemptWatchdog(H, now=0.0)
    acts, t = run_clock(w, 120, cpu_per_s=1.0, beat_every=5)      # compiling, beating
    assert acts == []
    last_beat = 120.0
    acts, t = run_clock(w, 1000, cpu_per_s=0.0, start=t, cpu0=120.0)   # deadlocked
    assert kinds(acts) == ["Warn", "DumpStacks", "Kill"]
    assert last_beat + 60 < t <= last_beat + 62                   # within hang_s (+ a tick)
    assert "idle" in w.hang and "hang_s 60s" in w.hang and "warm-up/compile" in w.hang


def test_silent_but_busy_is_left_alone_until_the_phase_threshold():
    """No heartbeat (e.g. a native compile holding the GIL) but the tree burns CPU: not stuck
    by hang_s; the warmup_s/train_s bound applies too."""
    w = AttemptWatchdog(H, now=0.0)
    acts, t = run_clock(w, 2000, cpu_per_s=1.0)
    assert kinds(acts) == ["Warn", "DumpStacks", "Kill"] and 900 < t <= 902
    assert "threshold 900s" in w.hang


def test_silent_with_io_is_not_stuck():
    w = AttemptWatchdog(H, now=0.0)
    acts, _ = run_clock(w, 300, cpu_per_s=0.0, io_per_s=1 << 20)   # reading a model
    assert acts == []


def test_stuck_after_training_started_and_after_a_cpu_burst():
    w = AttemptWatchdog(H, now=0.0)
    w.feed(step(1), 10.0)
    w.activity(10.0, 5.0)
    # 30 s of busy silence, then idle: detected 60 s after the tree went idle
    acts, t = run_clock(w, 40, cpu_per_s=1.0, start=10.0, cpu0=5.0)
    assert acts == []
    acts, t = run_clock(w, 1000, cpu_per_s=0.0, start=40.0, cpu0=35.0)
    # (under 10% of a core over the last 60 s: the last busy seconds count in the window)
    assert kinds(acts)[-1] == "Kill" and 90 < t <= 102 and "during training" in w.hang


def test_without_samples_or_with_hang_s_off_the_old_thresholds_rule():
    w = AttemptWatchdog(H, now=0.0)
    assert w.tick(899.0) == []                                    # no samples: unknown
    assert kinds(w.tick(901.0))[-1] == "Kill"
    off = Thresholds(**{**H.__dict__, "hang_s": 0.0})
    w = AttemptWatchdog(off, now=0.0)
    acts, t = run_clock(w, 2000, cpu_per_s=0.0)
    assert 900 < t <= 902


def test_hang_s_comes_from_the_spec_thresholds_with_a_default():
    assert Thresholds.from_user({"warmup_s": 1, "train_s": 2, "live_grace_s": 3,
                                 "kill_grace_s": 4, "stop_timeout_s": 5}).hang_s == 60.0
    assert Thresholds.from_user({"warmup_s": 1, "train_s": 2, "live_grace_s": 3,
                                 "kill_grace_s": 4, "stop_timeout_s": 5,
                                 "hang_s": 20}).hang_s == 20.0


def test_a_stopped_process_is_frozen_after_frozen_s_without_progress():
    t = Thresholds(**{**T.__dict__, "hang_s": 60.0, "frozen_s": 5.0})
    w = AttemptWatchdog(t, now=0.0)
    w.feed('@dfo {"kind": "heartbeat", "phase": "train"}', 1.0)
    w.activity(2.0, 1.0, 0, stopped=(42,))
    assert w.tick(6.5) == []                   # stopped 4.5 s: not yet
    w.activity(7.0, 1.0, 0, stopped=(42,))
    acts = w.tick(7.1)
    assert kinds(acts) == ["Warn", "Kill"]     # no stacks: a stopped process cannot answer
    assert w.frozen and w.hang == w.frozen and "process 42 of the attempt stopped (state T" \
        in w.frozen and "for 5s" in w.frozen


def test_a_stopped_process_that_is_continued_or_progress_is_not_frozen():
    t = Thresholds(**{**T.__dict__, "hang_s": 60.0, "frozen_s": 5.0})
    w = AttemptWatchdog(t, now=0.0)
    w.activity(1.0, 1.0, 0, stopped=(42,))
    w.activity(4.0, 1.0, 0, stopped=())        # SIGCONT: the clock starts over
    w.activity(5.0, 1.0, 0, stopped=(42,))
    assert w.tick(9.0) == [] and w.frozen is None
    # a stopped helper while the trainer still beats is not frozen (yet)
    w2 = AttemptWatchdog(t, now=0.0)
    w2.activity(1.0, 1.0, 0, stopped=(43,))
    for s in range(2, 20):
        w2.feed('@dfo {"kind": "heartbeat", "phase": "train"}', float(s))
        w2.activity(float(s), 1.0 + s, 0, stopped=(43,))
        assert w2.tick(float(s) + 0.5) == []
    off = Thresholds(**{**T.__dict__, "hang_s": 0.0, "frozen_s": 0.0})
    w3 = AttemptWatchdog(off, now=0.0)
    w3.activity(1.0, 0.0, 0, stopped=(44,))
    assert w3.tick(9.0) == []


def test_a_hang_due_while_a_process_is_stopped_is_frozen_not_compile_hang():
    from orchestrator.common.classify import classify

    t = Thresholds(**{**T.__dict__, "hang_s": 10.0, "frozen_s": 600.0})
    w = AttemptWatchdog(t, now=0.0)
    for s in range(0, 13):
        w.activity(float(s), 1.0, 0, stopped=(42,) if s >= 1 else ())
    acts = w.tick(12.0)
    assert kinds(acts) == ["Warn", "Kill"] and w.frozen and w.frozen_on is None
    d = classify([], signal=9, hang=w.hang, frozen=w.frozen)
    assert (d.cls, d.reason, d.permanent) == ("frozen", w.frozen, False)


def test_a_hang_due_while_a_peers_process_is_stopped_is_that_peers_freeze():
    # a group's head: its ranks wait idle on a peer whose trainer is stopped; the peer's
    # report of its stopped pids makes the hang that comes due ``frozen`` on that node
    from orchestrator.common.classify import classify

    t = Thresholds(**{**T.__dict__, "hang_s": 10.0, "frozen_s": 60.0})
    w = AttemptWatchdog(t, now=0.0)
    for s in range(0, 13):
        w.activity(float(s), 1.0, 0)
        if s >= 2:
            w.stopped_elsewhere(float(s), "lab-b", (4242,))
    acts = w.tick(12.0)
    assert kinds(acts) == ["Warn", "Kill"] and w.frozen     # no stacks: nothing to ask
    assert w.frozen.startswith("node lab-b: process 4242 of the attempt stopped (state T")
    assert w.frozen_on == "lab-b"
    assert "for 10s" in w.frozen
    d = classify([], signal=9, hang=w.hang, frozen=w.frozen)
    assert (d.cls, d.reason, d.permanent) == ("frozen", w.frozen, False)
    # the peer's report alone judges nothing here (frozen_s is the peer's own check) ...
    w2 = AttemptWatchdog(t, now=0.0)
    w2.stopped_elsewhere(1.0, "lab-b", (4242,))
    w2.feed('@dfo {"kind": "heartbeat", "phase": "train"}', 8.0)
    assert w2.tick(9.0) == [] and w2.frozen is None
    # ... a peer that is running again is no cause, and frozen_s=0 turns the rule off
    for th, clear in ((t, True), (Thresholds(**{**t.__dict__, "frozen_s": 0.0}), False)):
        w3 = AttemptWatchdog(th, now=0.0)
        for s in range(0, 13):
            w3.activity(float(s), 1.0, 0)
        w3.stopped_elsewhere(3.0, "lab-b", (4242,))
        if clear:
            w3.stopped_elsewhere(5.0, None)
        w3.tick(12.0)
        assert w3.frozen is None and w3.hang and "process tree idle" in w3.hang
