"""The pure watchdog (orchestrator.ops.watchdog): lines and a fake clock in, actions out.
No processes, no files, no sleeping."""

from __future__ import annotations

import json

from orchestrator.ops.watchdog import (Checkpoint, DumpStacks, Kill, Step, Terminate,
                                       Thresholds, Warn, Watchdog)

T = Thresholds(warmup_s=100, train_s=10, live_grace_s=5, kill_grace_s=3, stop_timeout_s=40,
               collapse_fraction=0.5, collapse_steps=3, baseline_steps=3, skip_steps=1)


def step(n: int, tps: float = 1000.0, loss: float = 1.0) -> str:
    return "@dfo " + json.dumps({"kind": "step", "step": n, "tokens_per_s": tps, "loss": loss})


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_quiet_attempt_needs_nothing():
    w = Watchdog(T, now=0.0)
    assert w.feed("loading the target model", 1.0) == []
    assert w.tick(50.0) == [] and not w.reached_train and w.hang is None


def test_no_progress_during_warmup_dumps_stacks_then_kills_once():
    w = Watchdog(T, now=0.0)
    assert w.tick(100.0) == []                 # at the threshold: not yet
    acts = w.tick(100.5)
    assert kinds(acts) == ["Warn", "DumpStacks", "Kill"]
    assert "warm-up/compile" in w.hang and "threshold 100s" in w.hang
    assert acts[0] == Warn(w.hang) and acts[1] == DumpStacks(w.hang)
    assert w.tick(101.0) == []                 # the kill is repeated every 2s, not every poll
    assert kinds(w.tick(102.6)) == ["Kill"]


def test_training_uses_the_train_threshold_and_markers_are_progress():
    w = Watchdog(T, now=0.0)
    acts = w.feed(step(1), 50.0)
    assert acts == [Step(1, 1000.0, None)] and w.reached_train
    assert w.tick(59.0) == []
    w.feed('@dfo {"kind": "heartbeat"}', 59.0)  # any marker is progress
    assert w.tick(68.0) == []
    acts = w.tick(69.5)
    assert kinds(acts) == ["Warn", "DumpStacks", "Kill"] and "during training" in w.hang
    assert w.healthy_s(70.0) == 20.0


def test_checkpoint_marker():
    w = Watchdog(T, now=0.0)
    acts = w.feed('@dfo {"kind": "checkpoint", "step": 4, "path": "/c/step_4"}', 1.0)
    assert acts == [Checkpoint(4, "/c/step_4")]


def test_live_rule_warns_then_terminates_after_grace_then_kills():
    w = Watchdog(T, now=0.0)
    acts = w.feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", 10.0)
    assert kinds(acts) == ["Warn"] and "oom" in acts[0].reason
    assert w.feed("torch.OutOfMemoryError again", 11.0) == []   # acted on once
    assert w.tick(14.9) == []
    assert kinds(w.tick(15.0)) == ["Terminate"]
    assert w.tick(17.9) == []                                    # kill_grace_s = 3
    assert kinds(w.tick(18.0)) == ["Kill"]
    assert w.hang is None and "oom" in w.scan.hits


def test_dense_fallback_is_acted_on_at_once_with_the_stop_timeout():
    w = Watchdog(T, now=0.0)
    acts = w.feed("UserWarning: this materializes the full scores matrix", 5.0)
    assert kinds(acts) == ["Warn"]
    assert kinds(w.tick(5.0)) == ["Terminate"]
    assert w.tick(44.9) == [] and kinds(w.tick(45.0)) == ["Kill"]


def test_dense_fallback_expected_for_uncompiled_flex():
    w = Watchdog(T, now=0.0, dense_expected=True)
    assert w.feed("this materializes the full scores matrix", 5.0) == []
    assert w.tick(6.0) == [] and "dense_fallback" in w.scan.hits


def test_throughput_collapse_learns_a_baseline_then_terminates():
    w = Watchdog(T, now=0.0)
    w.feed(step(1, 50.0), 1.0)                                   # skipped (compile)
    for i, tps in enumerate((1000.0, 1100.0, 900.0), start=2):
        acts = w.feed(step(i, tps), float(i))
    assert acts[-1] == Step(4, 900.0, 1000.0)                     # the median
    assert w.feed(step(5, 100.0), 5.0) == [Step(5, 100.0, 1000.0)]
    w.feed(step(6, 100.0), 6.0)
    acts = w.feed(step(7, 100.0), 7.0)
    assert kinds(acts) == ["Warn", "Step"] and acts[0].reason.startswith("throughput collapse")
    assert w.collapse and kinds(w.tick(7.0)) == ["Terminate"]
    assert w.tick(46.9) == [] and kinds(w.tick(47.0)) == ["Kill"]
    assert w.healthy_s(50.0) == 0.0


def test_a_known_baseline_is_used_from_the_first_step():
    w = Watchdog(T, now=0.0, baseline=1000.0)
    for i in range(1, 4):
        acts = w.feed(step(i, 10.0), float(i))
    assert kinds(acts) == ["Warn", "Step"]


def test_stop_terminates_and_kills_after_the_stop_timeout():
    w = Watchdog(T, now=0.0)
    assert w.stop(1.0) == [Terminate("stop requested")] and w.stopping
    assert w.stop(2.0) == []
    assert w.tick(40.9) == []                                     # no hang while stopping
    assert kinds(w.tick(41.0)) == ["Kill"] and w.hang is None
    # a fatal line while stopping changes nothing
    assert w.feed("CUDA out of memory", 42.0) == []


def test_nan_loss_marker_is_live():
    w = Watchdog(T, now=0.0)
    acts = w.feed(step(3, loss=float("nan")), 1.0)
    assert kinds(acts) == ["Step", "Warn"] and "nan_loss" in acts[1].reason


def test_actions_are_values():
    assert Kill("x") == Kill("x") and Terminate("a") != Terminate("b")
