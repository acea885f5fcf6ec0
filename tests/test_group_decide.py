"""Pure parts of a multi-node run's coordination: the root cause among node ends, lost
nodes from heartbeat observations, the head's decision and what a peer mirrors, the
torchrun argv and env of one node's attempt (no I/O)."""

from __future__ import annotations

import pytest

from dfo_contract.state_records import CheckpointRef
from dfo_contract.failure_classes import FAILURE_CLASSES
from dfo_contract import events as ev
from orchestrator.common.classify_rules import GROUP_CLASSES, NODE_LOST, PEER_ABORT
from orchestrator.common.fallback import validate_ladders
from orchestrator.common.errors import ConfigError
from orchestrator.common.budget import cannot_do_better
from dfo_contract.errors import ContractError
from dfo_contract.group_store import GroupVerdict, NodeOutcome, end_text, read_end
from dfo_contract.state_records import EvidenceLine
from orchestrator.supervisor.policy.group_decide import (Heartbeats, caches_cleared, lost_end, peer_step,
                                           root_cause, run_healthy_s)
from dfo_contract.runstate import Attempt
from orchestrator.common.launch_argv import Rendezvous, group_env, trainer_argv


def end(node, cls, *, origin=False, healthy=0.0, host=None):
    return NodeOutcome(node=node, host=host or f"gpu{node + 1}", cls=cls, reason=f"{cls} here",
                   origin=origin, healthy_s=healthy)


def test_a_real_class_beats_peer_abort_and_a_secondary_crash():
    ends = [end(0, PEER_ABORT), end(1, "fx_trace_race", origin=True)]
    assert root_cause(ends).node == 1 and root_cause(ends).cls == "fx_trace_race"
    # the head crashed because its peer died (gloo connection reset): the peer's FX error
    # is the cause, though the head is node 0
    ends = [end(0, "crash"), end(1, "fx_trace_race")]
    assert root_cause(ends).cls == "fx_trace_race"


def test_ties_go_to_the_origin_then_the_lowest_node():
    assert root_cause([end(0, "crash"), end(1, "crash", origin=True)]).node == 1
    assert root_cause([end(0, "crash"), end(1, "crash"), end(2, "crash")]).node == 0


def test_node_lost_wins_and_done_on_the_head_is_done():
    ends = [end(0, "crash"), lost_end(1, "gpu2", 21.4, "pair")]
    r = root_cause(ends)
    assert r.cls == NODE_LOST and "node gpu2 lost (no heartbeat for 21 s)" in r.reason
    assert "dfo launch --group pair --resume latest" in r.reason
    assert root_cause([end(0, "done"), end(1, PEER_ABORT)]).cls == "done"
    assert root_cause([end(0, "done"), end(1, "done")]).cls == "done"


def test_all_peer_abort_is_a_crash():
    r = root_cause([end(0, PEER_ABORT), end(1, PEER_ABORT)])
    assert r.cls == "crash" and "peer's abort" in r.reason


def test_node_end_round_trip_and_run_health():
    e = NodeOutcome(node=1, host="b", cls="oom", reason="r", exit_code=1, reached_train=True,
                healthy_s=3.5, permanent=False, origin=True,
                evidence=(EvidenceLine(line=1, text="OutOfMemoryError", rule="torch-oom"),))
    assert read_end(end_text(e)) == e
    assert NodeOutcome.from_json(e.to_json()) == e and e.event(2).evidence == list(e.evidence)
    assert run_healthy_s([end(0, "crash", healthy=40.0), end(1, "oom", healthy=0.0)]) == 40.0


def test_a_nodes_cache_fault_travels_in_its_end_and_counts_as_a_change():
    line = "ImportError: /r/runs/x/cache/inductor/ab/main.so: file too short"
    e = NodeOutcome(node=1, host="lab-b", cls="crash", reason="the trainer raised ImportError",
                exit_code=1, cache_fault=line)
    assert read_end(end_text(e)) == e
    assert NodeOutcome.from_json({**e.to_json(), "cache_fault": None}).cache_fault is None
    assert caches_cleared([end(0, PEER_ABORT), e]) == ("lab-b",)
    assert caches_cleared([end(0, PEER_ABORT), end(1, "crash")]) == ()


def _group_attempt(n: int, ends: list[NodeOutcome]) -> Attempt:
    """Attempt n as the head records it: the run's cause (the root of every node's end)."""
    root = root_cause(ends)
    return Attempt(n=n, started_at=float(n), cls=root.cls, reason=f"node {root.host}: "
                   f"{root.reason}", reached_train=False,
                   checkpointed=False)


def test_a_peer_failing_the_same_way_at_start_up_twice_stops_the_group():
    # the head's own ends differ (a gloo reset, then a peer's abort); the run's cause is the
    # same start-up crash on lab-b both times: a third attempt cannot do better
    peer = NodeOutcome(node=1, host="lab-b", cls="crash", reason="the trainer raised ValueError: x",
                   origin=True)
    a1 = _group_attempt(1, [end(0, "crash"), peer])
    a2 = _group_attempt(2, [end(0, PEER_ABORT), peer])
    why = cannot_do_better(a1, a2, restart_changes_config=False)
    assert why and why.startswith("attempts 1 and 2 failed the same way before their first "
                                  "training step")
    # unless the restart clears lab-b's compile cache (its part died loading from it)
    faulty = [end(0, PEER_ABORT), NodeOutcome(**{**peer.__dict__, "cache_fault": "ImportError"})]
    assert cannot_do_better(a1, _group_attempt(2, faulty),
                            restart_changes_config=bool(caches_cleared(faulty))) is None
    # another cause the second time: restart as the budget allows
    other = NodeOutcome(node=1, host="lab-b", cls="oom", reason="OutOfMemoryError", origin=True)
    assert cannot_do_better(a1, _group_attempt(2, [end(0, PEER_ABORT), other]),
                            restart_changes_config=False) is None


def test_heartbeats_lost_by_the_observers_clock():
    hb = Heartbeats(lost_s=5.0, start=100.0)
    hb.observe(1, 1, 100.5)
    hb.observe(2, None, 100.5)          # could not be read: no news
    assert hb.lost([1, 2], 104.0) == []
    hb.observe(1, 2, 104.0)
    assert hb.lost([1, 2], 106.0) == [2]           # never beat since the start
    hb.observe(1, 2, 108.0)                         # same value: no change
    assert hb.lost([1, 2], 109.5) == [1, 2]
    assert hb.silent_s(1, 109.5) == pytest.approx(5.5)


def test_decision_round_trip_and_the_peer_mirrors_it():
    fb = ev.Fallback.from_body({"attempt": 1, "class": "fx_trace_race", "step": "compile_gate",
                                    "changed": {"compile.gate": True},
                                    "overrides": {"compile.gate": True}, "restore_cache": True})
    dec = GroupVerdict(action="restart", cause=end(1, "fx_trace_race"),
                       overrides={"compile.gate": True}, fallback=fb,
                       restart=ev.Restart.from_body({"attempt": 2, "delay_s": 0.1,
                                                         "reason": "restart 1/5"}),
                       last_checkpoint=CheckpointRef(step=4, path="/h/ck/step_4"), last_step=5)
    assert GroupVerdict.from_text(dec.to_text()) == dec
    st = peer_step(dec, 1, node=1, host="gpu2")
    assert [e.kind for e in st.events] == ["group_decision", "fallback", "restart"]
    assert st.restore_cache and st.events[1].attempt == 1 and st.events[2].attempt == 2
    assert st.final is None and st.overrides == {"compile.gate": True}
    assert st.fallback and st.fallback.to_json() == {"class": "fx_trace_race", "step": "compile_gate",
                           "changed": {"compile.gate": True}, "attempt": 1}
    fin = GroupVerdict(action="final", status="failed", reason="node gpu2 lost")
    st = peer_step(fin, 3, node=1, host="gpu2")
    assert st.final == ("failed", "node gpu2 lost") and len(st.events) == 1
    for e in peer_step(dec, 1, node=1, host="gpu2").events:
        assert e.describe() and ev.decode(ev.encode_line(e)) == e
    with pytest.raises(ValueError):
        GroupVerdict.from_text('{"action": "maybe"}')
    with pytest.raises(ContractError):
        GroupVerdict.from_text('{"v": 2, "action": "final"}')


def test_group_classes_have_no_ladder_or_budget():
    assert set(GROUP_CLASSES) == {PEER_ABORT, NODE_LOST}
    assert not set(GROUP_CLASSES) & set(FAILURE_CLASSES)
    with pytest.raises(ConfigError):
        validate_ladders({"node_lost": ["same"]})


def test_new_event_kinds_are_described():
    for e in [ev.GroupStart(node=0, host="a", nodes=["a", "b"], head_addr="10.0.0.1",
                            coord_port=29401),
              ev.PeerAbort(attempt=1, node=0, host="a", reason="x"),
              end(1, "oom").event(1),
              ev.NodeLost(attempt=1, node=1, host="b", silent_s=30.0, reason="lost b"),
              ev.GroupDecision(attempt=1, node=0, host="a", action="final", status="failed",
                               reason="z", cause=end(1, "oom", host="b"))]:
        line = e.describe()
        assert line and line != e.kind


def test_trainer_argv_for_one_node_of_a_group():
    head = trainer_argv("py", "c.yaml", {"compile.gate": True}, run_dir="/d", checkpoint_dir="/c",
                        resume="/h/ck/step_4", layout=None, nproc=2,
                        rdzv=Rendezvous(2, "10.0.0.1", 29400, "run-a3", is_host=True))
    assert head[:3] == ["py", "-m", "torch.distributed.run"]
    assert head[3:10] == ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29400",
                          "--rdzv-id=run-a3", "--rdzv-conf=is_host=1", "--max-restarts=0",
                          "--nproc_per_node=2"]
    assert "--parallel.layout=ddp" in head and head[-2:] == ["--resume", "/h/ck/step_4"]
    peer = trainer_argv("py", "c.yaml", {}, run_dir="/d", checkpoint_dir="/c", resume=None,
                        nproc=1, rdzv=Rendezvous(2, "fd00::1", 29400, "r-a1", is_host=False,
                                                 local_addr="fd00::2"))
    assert "--rdzv-endpoint=[fd00::1]:29400" in peer and "--rdzv-conf=is_host=0" in peer
    assert "--local-addr=fd00::2" in peer and not any(a.startswith("--local-addr") for a in head)
    assert "--standalone" not in peer


def test_group_env():
    env = group_env(1, {"GLOO_SOCKET_IFNAME": "lo", "DFO_NODE_RANK": "9"})
    assert env == {"GLOO_SOCKET_IFNAME": "lo", "DFO_NODE_RANK": "1"}


def test_local_addr_is_the_source_address_towards_the_head():
    from orchestrator.supervisor.hostprobe import local_addr

    assert local_addr("127.0.0.1", 29400) == "127.0.0.1"
    assert local_addr("192.0.2.1", 9) not in ("", "192.0.2.1")  # a route's source, or None


def test_a_node_that_did_not_run_itself_knows_it():
    from orchestrator.supervisor.policy.group_decide import Heartbeats

    hb = Heartbeats(lost_s=6.0, start=0.0)
    for t in (1.0, 2.0, 3.0):
        hb.tick(t)
    assert hb.own_silent_s(3.5) == pytest.approx(1.0)
    assert hb.own_silent_s(40.0) == pytest.approx(37.0)       # it has not beaten since 3
    hb.tick(40.0)                                             # SIGCONT: the gap is known
    assert hb.own_silent_s(41.0) == pytest.approx(37.0)
    assert hb.own_silent_s(60.0) == pytest.approx(20.0)       # long ago: only the beat gap


def test_a_node_whose_supervisor_died_is_the_root_cause():
    from orchestrator.supervisor.policy.group_decide import root_cause

    head = NodeOutcome(node=0, host="gpu1", cls="nccl_timeout", reason="gloo timed out",
                       origin=True)
    died = NodeOutcome(node=1, host="gpu2", cls="crash", reason="the supervisor on gpu2 died",
                       origin=True, supervisor_died=True)
    assert root_cause([head, died]) == died
    assert read_end(end_text(died)) == died


def test_a_node_is_named_once_in_the_runs_reason():
    from orchestrator.supervisor.policy.group_decide import node_lost_reason, on_node

    lost = node_lost_reason("lab-b", 130, "pair")
    assert on_node("lab-b", lost) == lost and lost.count("lab-b") == 1
    assert on_node("lab-b", "oom: CUDA out of memory") == "node lab-b: oom: CUDA out of memory"
    assert on_node("lab-b", "node lab-bb lost") == "node lab-b: node lab-bb lost"
