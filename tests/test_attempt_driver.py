"""The attempt driver's steps every role runs its attempts through (``role.Driver``:
``judge``, ``next_config``, ``backoff``) and what a group's role keeps of one attempt
(``group.GroupAttempt``): the watch's ``Outcome`` carries nothing of a role (no I/O beyond
a temporary run directory; no store, no trainer)."""

from __future__ import annotations

import dataclasses
import functools
import types

from dfo_contract import events
from dfo_contract import runstate as rs
from dfo_contract.runspec import Group
from dfo_contract.runstate import Attempt, CheckpointRef, FallbackRecord, RunState
from orchestrator.common.classify import Diagnosis, classify
from orchestrator.common.classify_rules import PEER_ABORT
from orchestrator.supervisor import runfiles
from orchestrator.supervisor.core import Supervisor
from orchestrator.supervisor.group import GroupAttempt, GroupHead
from orchestrator.supervisor.group_member import GroupMember
from orchestrator.supervisor.record import RunRecord, Stop
from orchestrator.supervisor.role import SoloRole
from orchestrator.supervisor.watch import Outcome

GROUP_ONLY = {"peer_abort", "lost", "origin", "abort_set", "kill_at", "store_next",
              "stopped_told", "caches_cleared", "frozen_on"}


def _driver(tmp_path) -> Supervisor:
    """A supervisor with only what its steps use: the run's record and its source."""
    sup = Supervisor.__new__(Supervisor)
    sup.record = RunRecord(str(tmp_path), RunState.new("r-1", "r", now=0.0))
    sup.source = types.SimpleNamespace(own=False)
    sup.stop, sup.run_dir, sup.role = Stop(), str(tmp_path), SoloRole()
    sup.state.attempts.append(Attempt(n=1, started_at=0.0))
    sup.state.attempt = 1
    return sup


def _classified(tmp_path) -> list[events.Classified]:
    return [e for e in events.read_events_file(str(tmp_path / rs.EVENTS_FILE))
            if isinstance(e, events.Classified)]


def _role(cls, node: int):
    gs = Group(name="g", nodes=("gpu1", "gpu2"), node=node, head_addr="10.0.0.1", port=29500,
               coord_port=29501, nproc=1)
    return cls(gs, "r-1", "/r", 1.0, RunRecord("/r", RunState.new("r-1", "r", now=0.0)),
               Stop())


def test_the_watch_outcome_carries_nothing_of_a_group():
    assert not GROUP_ONLY & {f.name for f in dataclasses.fields(Outcome)}
    assert GROUP_ONLY - {"n"} <= {f.name for f in dataclasses.fields(GroupAttempt)}


def test_judge_records_the_class_and_emits_classified(tmp_path):
    sup = _driver(tmp_path)
    out = Outcome(exit_code=1)
    want = classify(out.scan, exit_code=1)
    diag = sup.judge(1, out)
    assert (diag.cls, diag.reason) == (want.cls, want.reason)
    att = sup.state.attempts[-1]
    assert (att.cls, att.reason) == (want.cls, want.reason)
    [ev] = _classified(tmp_path)
    assert (ev.attempt, ev.cls, ev.reason) == (1, want.cls, want.reason)


def test_judge_names_the_end_as_the_node_does(tmp_path):
    """A member's attempt that another node aborted first is recorded as ``peer_abort``;
    the diagnosis it returns is its own (the node's end carries both)."""
    sup = _driver(tmp_path)
    member = _role(GroupMember, 1)
    member.attempt(1).peer_abort = "node gpu1 aborted attempt 1: exit 1"
    out = Outcome(exit_code=1)
    diag = sup.judge(1, out, name=functools.partial(member.end_name, 1))
    assert diag.cls == classify(out.scan, exit_code=1).cls
    assert (sup.state.attempts[-1].cls, sup.state.attempts[-1].reason) == \
        (PEER_ABORT, "node gpu1 aborted attempt 1: exit 1")
    [ev] = _classified(tmp_path)
    assert (ev.cls, ev.reason) == (PEER_ABORT, "node gpu1 aborted attempt 1: exit 1")
    end = member.node_end(1, out, diag)
    assert (end.cls, end.reason, end.permanent, end.origin) == \
        (PEER_ABORT, "node gpu1 aborted attempt 1: exit 1", False, False)


def test_a_node_end_is_named_by_what_its_attempt_saw():
    diag = Diagnosis("oom", "OutOfMemoryError")
    member, head = _role(GroupMember, 1), _role(GroupHead, 0)
    assert member.end_name(1, diag) == ("oom", "OutOfMemoryError")
    member.attempt(1).peer_abort, member.attempt(1).origin = "node gpu1 aborted", True
    assert member.end_name(1, diag) == ("oom", "OutOfMemoryError")   # it aborted first
    member.attempt(1).lost = [(0, 12.0)]       # a member that lost the head: its own end
    assert member.end_name(1, diag) == ("oom", "OutOfMemoryError")
    head.attempt(1).lost = [(1, 12.0)]
    assert head.end_name(1, diag) == ("crash", "stopped: a node was lost")


def test_one_group_attempt_per_attempt():
    head = _role(GroupHead, 0)
    first = head.attempt(1)
    assert head.attempt(1) is first
    first.caches_cleared = ("gpu2",)
    assert head.clears_caches(1)
    assert head.attempt(2) is not first and head.attempt(2).caches_cleared == ()
    assert not head.clears_caches(2)
    assert not SoloRole().clears_caches(1)


def test_next_config_and_backoff(tmp_path):
    sup = _driver(tmp_path)
    given = {"train.micro_batch": 2}
    fb = FallbackRecord(cls="oom", step="halve_micro_batch", changed=given, attempt=1)
    sup.next_config(given, fb)
    sup.next_config(given, None)
    assert sup.state.overrides == given and sup.state.overrides is not given
    assert sup.state.fallbacks == [fb]
    sup.backoff()
    assert sup.state.status == "backoff"
    assert runfiles.read_state(str(tmp_path)).status == "backoff"
    sup.backoff(0.05)       # a wait: the run is running again after it, and saved so
    assert runfiles.read_state(str(tmp_path)).status == "running"
    sup.stop.request("dfo stop")
    sup.backoff(3600.0)     # a stop ends the wait at once
    assert runfiles.read_state(str(tmp_path)).status == "running"


def test_follow_and_attempt_decided(tmp_path):
    sup = _driver(tmp_path)
    ck = CheckpointRef(step=8, path="/runs/r/checkpoints/step_8")
    sup.follow(ck, 9)
    assert (sup.state.last_checkpoint, sup.state.last_step) == (ck, 9)
    sup.follow(None, None)            # nothing named: the run's progress stays
    assert (sup.state.last_checkpoint, sup.state.last_step) == (ck, 9)
    sup.attempt_decided(3)
    assert sup.state.attempt == 3
