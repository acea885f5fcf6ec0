"""The supervisor stops when another attempt cannot do better: the same error before the
first training step, twice, with the same config and nothing trained or saved in between
(the pure rule, and a real own command under the real supervisor); a finished command
that reports no steps, and an attempt that ended with no exit status, read as such."""

from __future__ import annotations

import sys

import pytest

from dfo_contract import events as ev
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.common.budget import cannot_do_better
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
    from orchestrator.common.errors import RunFailed
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


def test_signals_from_outside_and_a_growing_cache_are_not_the_same_failure():
    import signal

    def killed(n, sig=signal.SIGKILL, **kw):
        a = att(n, reason=f"the trainer ended with {signal.Signals(sig).name}", **kw)
        a.signal = sig
        return a
    # an OOM killer, an operator, a preemption agent: nothing about the code
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        assert cannot_do_better(killed(1, sig), killed(2, sig),
                                restart_changes_config=False) is None, sig
    exit6 = att(2, reason="the trainer ended with exit 6 (interrupted by a signal the "
                          "supervisor did not send)")
    exit6.exit_code = 6
    assert cannot_do_better(att(1, reason=exit6.reason), exit6,
                            restart_changes_config=False) is None
    # a signal the trainer sends itself (a segfault, an abort) is judged as before
    assert cannot_do_better(killed(1, signal.SIGSEGV), killed(2, signal.SIGSEGV),
                            restart_changes_config=False) is not None
    # a compile that got further (the run's compile cache grew) is progress
    grew = att(2)
    grew.cache_grew = True
    assert cannot_do_better(att(1), grew, restart_changes_config=False) is None
    still = att(2)
    still.cache_grew = False
    assert cannot_do_better(att(1), still, restart_changes_config=False) is not None


#: a "cold compile": no step line for a while (attempts 1 and 2, until killed), then steps
COLD = ("import os, time\n"
        "if int(os.environ['DFO_ATTEMPT']) < 3:\n"
        "    print('compiling', flush=True)\n"
        "    time.sleep(600)\n"
        "for i in range(1, 4):\n"
        "    print(f'step {i} loss 1.0 tok/s 10', flush=True)\n")


def test_two_outside_sigkills_during_a_cold_compile_do_not_end_the_run(run_ops, tmp_path):
    import os
    import signal

    from tests.supervisor_env import wait_for

    root, o = run_ops
    script = tmp_path / "cold.py"
    script.write_text(COLD)
    run_id = _launch(o, [sys.executable, str(script)], "cold")
    for n in (1, 2):    # a host's OOM killer, an operator, a preemption agent
        # each condition is waited for within its own pass of the loop
        st = wait_for(lambda: (s := o.status(run_id)[0].state).attempt == n  # noqa: B023
                      and s.trainer_pids and s, 60, f"attempt {n}")
        log = root / "runs" / run_id / f"attempt-{n}.log"
        wait_for(lambda: log.exists() and b"compiling" in log.read_bytes(),  # noqa: B023
                 60, "compiling")
        os.kill(st.trainer_pids[0], signal.SIGKILL)
    info = wait_final(o, run_id, timeout=120)
    assert info["status"] == "done", info["reason"]
    evs = events(root, run_id)
    assert [e.attempt for e in evs if e.kind == "attempt_start"] == [1, 2, 3]
    assert not [e for e in evs if e.kind == "give_up"]


def test_a_compile_that_gets_further_each_attempt_is_restarted(run_ops, tmp_path):
    root, o = run_ops
    script = tmp_path / "further.py"   # each attempt compiles one more kernel, then dies
    script.write_text(
        "import os, sys\n"
        "n = int(os.environ['DFO_ATTEMPT'])\n"
        "d = os.path.join(os.environ['DFO_RUN_DIR'], 'cache', 'inductor')\n"
        "os.makedirs(d, exist_ok=True)\n"
        "if n < 3:\n"
        "    open(os.path.join(d, f'kernel{n}.py'), 'w').write('x = 1\\n')\n"
        "    sys.exit(1)\n"
        "print('step 1 loss 1.0 tok/s 10', flush=True)\n")
    run_id = _launch(o, [sys.executable, str(script)], "further")
    info = wait_final(o, run_id, timeout=120)
    assert info["status"] == "done", info["reason"]
    assert [a["cache_grew"] for a in info["attempts"]] == [True, True, False]
