"""The supervisor stops when another attempt cannot do better: the same error before the
first training step, twice, with the same config and nothing trained or saved in between
(the pure rule, and a real own command under the real supervisor); a finished command
that reports no steps, and an attempt that ended with no exit status, read as such."""

from __future__ import annotations

import sys

import pytest

from dfo_contract import events as ev
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.ops.budget import cannot_do_better
from dfo_contract.runstate import Attempt
from orchestrator.transport.local import LocalTransport
from tests.supervisor_env import FAST, events, local_host, make_root, wait_final


def att(n, *, cls="crash", reason="the trainer raised ValueError: x (exit 1)", ov=None,
        trained=False, saved=False):
    return Attempt(n=n, started_at=0.0, cls=cls, reason=reason, overrides=dict(ov or {}),
                   reached_train=trained, checkpointed=saved)


def test_the_rule():
    a1, a2 = att(1), att(2)
    why = cannot_do_better(a1, a2, restart_changes_config=False)
    assert why.startswith("attempts 1 and 2 failed the same way before their first training "
                          "step") and "cannot do better" in why and "fix the error" in why
    assert cannot_do_better(None, a1, restart_changes_config=False) is None
    # a fallback that changes the config may do better
    assert cannot_do_better(a1, a2, restart_changes_config=True) is None
    # anything that differs: a step trained, a checkpoint saved, another error or config
    for other in (att(2, trained=True), att(2, saved=True), att(2, reason="other"),
                  att(2, cls="oom"), att(2, ov={"train.lr": 1})):
        assert cannot_do_better(a1, other, restart_changes_config=False) is None, other
    # attempts recorded before these fields existed are never judged
    old = Attempt(n=1, started_at=0.0, cls="crash", reason=a1.reason)
    assert cannot_do_better(old, a2, restart_changes_config=False) is None
    assert "docs/recovery.md" in cannot_do_better(att(1, cls="nccl_timeout"),
                                                  att(2, cls="nccl_timeout"),
                                                  restart_changes_config=False)


def test_attempt_end_without_an_exit_status_says_so():
    e = ev.AttemptEnd(attempt=3, exit_code=None, signal=None, duration_s=12.0,
                      note="supervisor died; attempt abandoned")
    assert e.describe() == ("attempt 3 ended: no exit status (supervisor died; attempt "
                            "abandoned) after 12s")
    assert "None" not in ev.AttemptEnd(attempt=1, exit_code=None, signal=None,
                                       duration_s=1.0).describe()


@pytest.fixture
def run_ops(tmp_path):
    root = make_root(tmp_path)
    return root, RunOps(LocalTransport("local"), local_host(root))


def _launch(ops_, cmd, name):
    from orchestrator.errors import RunFailed
    import re

    try:
        return ops_.launch(LaunchOptions(command=cmd, run_name=name, backoff_scale=0.01,
                                         thresholds=dict(FAST), env_check=False)).run_id
    except RunFailed as e:   # it may end before launch has finished watching its start
        return re.search(r"run (\S+) failed at start", str(e)).group(1)


@pytest.mark.slow
def test_a_script_that_fails_at_once_stops_after_its_second_attempt(run_ops):
    root, o = run_ops
    run_id = _launch(o, [sys.executable, "-c", "raise ValueError('lr must be > 0, got -1')"],
                     "bad")
    info = wait_final(o, run_id, timeout=180)
    evs = events(root, run_id)
    assert info["status"] == "failed"
    assert [e.attempt for e in evs if e.kind == "attempt_start"] == [1, 2]
    assert "ValueError: lr must be > 0, got -1" in info["reason"]
    assert "cannot do better" in info["reason"] and "fix the error" in info["reason"]
    gave = [e for e in evs if e.kind == "give_up"]
    assert len(gave) == 1 and "attempts 1 and 2 failed the same way" in gave[0].reason


@pytest.mark.slow
def test_a_command_without_step_lines_finishes_without_a_step_none(run_ops):
    root, o = run_ops
    run_id = _launch(o, [sys.executable, "-c", "print('trained')"], "quiet")
    info = wait_final(o, run_id, timeout=180)
    assert info["status"] == "done"
    assert info["reason"] == "the command exited 0 (it reported no steps)"
