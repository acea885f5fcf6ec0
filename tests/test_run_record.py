"""The run's record (``supervisor.record.RunRecord``) and its transitions, on a temporary
run directory: each sets its fields, appends its event and writes ``state.json`` where it
says it does (no trainer, no supervisor process)."""

from __future__ import annotations

import os

import pytest

from dfo_contract import events
from dfo_contract import runstate as rs
from dfo_contract.runstate import (Attempt, BudgetState, CheckpointRef, EvidenceLine,
                                   FallbackRecord, RunState, ThroughputLowState)
from orchestrator.supervisor import runfiles
from orchestrator.supervisor.record import RunRecord


@pytest.fixture
def rec(tmp_path, capsys) -> RunRecord:
    return RunRecord(str(tmp_path), RunState.new("r-1", "r", now=0.0))


def _saved(rec: RunRecord) -> RunState:
    return runfiles.read_state(rec.run_dir)


def _kinds(rec: RunRecord) -> list[str]:
    path = rec.path(rs.EVENTS_FILE)
    return [e.kind for e in events.read_events_file(path)] if os.path.exists(path) else []


def _last(rec: RunRecord) -> events.Event:
    return events.read_events_file(rec.path(rs.EVENTS_FILE))[-1]


def _started(rec: RunRecord, n: int = 1, overrides: dict | None = None) -> None:
    rec.preparing(overrides)
    rec.attempt_opened(n, resume=None, argv=["python", "-m", "t"], log=rs.attempt_log_name(n))
    rec.attempt_started(n, 4242, resume=None, argv=["python", "-m", "t"],
                        log=rs.attempt_log_name(n))


def test_the_start_of_a_supervisor(rec):
    rec.use_config({"train.micro_batch": 4})
    rec.supervisor_started(123, "setsid", resumed=False)
    assert not os.path.exists(rec.path(rs.STATE_FILE))    # written with ``running``
    assert _kinds(rec) == ["supervisor_start"]
    assert rec.state.last_event == _last(rec).describe()
    rec.running()
    st = _saved(rec)
    assert (st.status, st.pid, st.mode) == ("running", 123, "setsid")
    assert st.overrides == {"train.micro_batch": 4}
    assert st.last_event == "supervisor started (setsid, pid 123)"


def test_an_attempt_from_its_start_to_its_end(rec):
    rec.preparing({"a": 1})
    assert (rec.state.status, rec.state.overrides) == ("running", {"a": 1})
    rec.attempt_opened(1, resume="/ck/4", argv=["x"], log="attempt-1.log")
    assert rec.state.attempt == 1 and rec.state.current.overrides == {"a": 1}
    assert not os.path.exists(rec.path(rs.STATE_FILE))
    rec.attempt_started(1, 4242, resume="/ck/4", argv=["x"], log="attempt-1.log")
    st = _saved(rec)
    assert st.trainer_pids == [4242] and st.attempts[0].pid == 4242
    start = _last(rec)
    assert isinstance(start, events.AttemptStart)
    assert (start.attempt, start.resume, start.overrides, start.argv, start.pid, start.log) == \
        (1, "/ck/4", {"a": 1}, ["x"], 4242, "attempt-1.log")

    rec.attempt_ended(1, ended_at=50.0, exit_code=1, signal=None, duration_s=12.34567,
                      reached_train=True, checkpointed=True, cache_grew=False,
                      clock={"warmup_s": 3.0})
    st = _saved(rec)
    att = st.attempts[0]
    assert (att.ended_at, att.exit_code, att.signal, att.reached_train, att.checkpointed,
            att.cache_grew) == (50.0, 1, None, True, True, False)
    assert st.trainer_pids == [] and st.throughput_low is None
    end = _last(rec)
    assert isinstance(end, events.AttemptEnd)
    assert (end.duration_s, end.reached_train, end.warmup_s) == (12.346, True, 3.0)

    ev = [EvidenceLine(line=3, text="boom", rule="r")]
    rec.classified(1, "crash", "exit 1", evidence=ev, also=["oom"])
    assert (rec.state.current.cls, rec.state.current.reason) == ("crash", "exit 1")
    assert _saved(rec).attempts[0].cls is None     # saved by the decision that follows
    c = _last(rec)
    assert isinstance(c, events.Classified) and (c.evidence, c.also) == (ev, ["oom"])
    rec.cause("nccl", "a peer")
    assert (rec.state.current.cls, rec.state.current.reason) == ("nccl", "a peer")
    assert _kinds(rec) == ["attempt_start", "attempt_end", "classified"]


def test_an_attempt_that_never_started_and_one_decided_elsewhere(rec):
    rec.state.attempts.append(Attempt(n=1, started_at=0.0))
    rec.state.attempt = 1
    rec.attempt_opened(2, resume=None, argv=["x"], log="attempt-2.log")
    rec.attempt_dropped(2)
    assert rec.state.attempt == 1 and [a.n for a in rec.state.attempts] == [1]
    rec.attempt_decided(3)
    assert rec.state.attempt == 3
    assert _kinds(rec) == [] and not os.path.exists(rec.path(rs.STATE_FILE))


def test_what_the_watch_sees(rec):
    _started(rec, overrides={"a": 1})
    rec.progress(5, 100.0, 90.0)
    st = _saved(rec)
    assert (st.last_step, st.tokens_per_s, st.baseline_tokens_per_s, st.baseline_overrides) \
        == (5, 100.0, 90.0, {"a": 1})
    rec.progress(6, 50.0, 80.0)           # the baseline is the first one measured
    assert (_saved(rec).last_step, _saved(rec).baseline_tokens_per_s) == (6, 90.0)

    rec.checkpointed(1, 6, "/ck/6")
    assert _saved(rec).last_checkpoint == CheckpointRef(step=6, path="/ck/6")
    rec.evaluated(1, 6, 2.5, 2.7)
    assert (_saved(rec).accept_len, _saved(rec).best_accept_len) == (2.5, 2.7)

    rec.throughput_low(1, "tokens/s fell", since=7.0, cause="host_busy", summary="busy",
                       causes=["host_busy"], seen={"load": 9.0})
    assert _saved(rec).throughput_low == ThroughputLowState(
        cause="host_busy", summary="busy", since=7.0, attempt=1, reason="tokens/s fell")
    low = _last(rec)
    assert isinstance(low, events.ThroughputLow) and low.seen == {"load": 9.0}
    rec.throughput_ok(1, "back")
    assert _saved(rec).throughput_low is None
    rec.stopping(1, "dfo stop")
    assert _saved(rec).status == "stopping"
    assert _kinds(rec) == ["attempt_start", "checkpoint", "eval", "throughput_low",
                           "throughput_ok", "stopping"]
    assert _saved(rec).last_event == "stopping: dfo stop"


def test_the_standby(rec):
    rec.standby_started(2, 777)
    assert _saved(rec).standby_pid == 777
    rec.standby_gone(events.StandbyDiscarded(attempt=2, pid=777, reason="the run ended"))
    assert rec.state.standby_pid is None
    assert _saved(rec).standby_pid == 777          # written with the next save
    assert _kinds(rec) == ["standby_start", "standby_discarded"]


def test_between_attempts(rec):
    _started(rec, overrides={"a": 1})
    budget = BudgetState(counts={"oom": 1}, total=1, streak=1, startup_streak=1)
    rec.failure_counted(budget, startup=True)
    assert rec.state.budget == budget
    assert rec.state.last_startup_failure_overrides == {"a": 1}
    rec.failure_counted(budget, startup=False)
    assert rec.state.last_startup_failure_overrides is None
    rec.ladder_step("oom", 2)
    fb = FallbackRecord(cls="oom", step="halve_micro_batch", changed={"b": 2}, attempt=1)
    given = {"a": 1, "b": 2}
    rec.use_config(given, fb)
    assert rec.state.overrides == given and rec.state.overrides is not given
    rec.backoff()
    st = _saved(rec)
    assert (st.status, st.ladder_pos, st.fallbacks, st.budget) == \
        ("backoff", {"oom": 2}, [fb], budget)
    ck = CheckpointRef(step=8, path="/ck/8")
    rec.follow(ck, 9)
    rec.follow(None, None)            # nothing named: the run's progress stays
    assert (rec.state.last_checkpoint, rec.state.last_step) == (ck, 9)
    rec.running()
    assert _saved(rec).status == "running"


def test_the_end_is_written_with_the_final_word(rec):
    rec.running()
    rec.checkpointed(1, 4, "/ck/4")
    ev = [EvidenceLine(text="boom")]
    rec.ending("failed", "crash: no budget", ev)
    assert rec.state.final and rec.state.ended_at is not None
    assert _saved(rec).status == "running"        # not yet: run.lock goes first
    rec.ended(goodput=0.5, lost_s={"crash": 3.0})
    st = _saved(rec)
    assert (st.status, st.reason, st.evidence) == ("failed", "crash: no budget", ev)
    final = _last(rec)
    assert isinstance(final, events.Final)
    assert (final.status, final.reason, final.last_checkpoint, final.goodput, final.lost_s) == \
        ("failed", "crash: no budget", CheckpointRef(step=4, path="/ck/4"), 0.5, {"crash": 3.0})
    rec.ending("stopped", "dfo stop")             # no evidence given: it stays
    assert rec.state.evidence == ev


def test_a_supervisor_that_died_during_an_attempt(rec, tmp_path):
    _started(rec)
    rec.standby_started(2, 777)
    again = RunRecord(str(tmp_path), RunState.new("r-1", "r", now=1.0))
    assert again.resume() is None
    assert again.state.attempts[0].pid == 4242
    assert again.recovered() is True
    st = _saved(again)
    att = st.attempts[0]
    assert st.standby_pid is None and att.ended_at is not None
    assert (att.cls, att.reason) == ("crash", "the supervisor died during this attempt")
    end = _last(again)
    assert isinstance(end, events.AttemptEnd) and end.note == "supervisor died; attempt abandoned"
    assert again.recovered() is False               # its attempt has ended
    assert _kinds(again).count("attempt_end") == 1
