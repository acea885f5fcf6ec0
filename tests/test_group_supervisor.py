"""Two real supervisors on this machine as the two nodes of one run (two host roots, one
run id, a ``role`` section in each spec.json, rendezvous and coordination on loopback),
each running the real trainer with ``--parallel.layout ddp`` under real torchrun (gloo,
CPU, tiny model): one run, one decision."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dfo_contract import events as ev
from orchestrator.common.budget import BudgetPolicy
from orchestrator.common.fallback import merge_ladders
from orchestrator.common.group import GroupSpec
from dfo_contract.runspec import Bundled, Config, Identity, Resume, RunSpec
from orchestrator.common.launch_argv import supervisor_argv
from orchestrator.common.launch_argv import flatten
from orchestrator.plan.thresholds import thresholds as thresholds_of
from orchestrator.config.host_tree import HostTree
from orchestrator.plan.run_identity import make_run_id

from tests.supervisor_env import FAST, REPO, make_root, wait_for, write_config  # noqa: F401
from tests.lab.procs import free_port_pair

pytestmark = pytest.mark.slow

HOSTS = ("gpu1", "gpu2")


class Group:
    """Two nodes' run dirs + specs, as ``dfo launch --group`` writes them, and their
    supervisors (each in its own session, so a test can kill one node whole)."""

    def __init__(self, tmp: Path, assets: Path, *, name: str, faults=(None, None),
                 node_lost_s: float = 8.0, thresholds=None, budget=None, **train):
        self.run_id = make_run_id(name, time.time())
        tmp.mkdir(parents=True, exist_ok=True)
        port, coord = free_port_pair(), free_port_pair()
        cfg = write_config(tmp / "c.yaml", assets, **train)
        base = flatten(__import__("yaml").safe_load(cfg.read_text()))
        self.roots, self.dirs, self.ckdirs, self.procs = [], [], [], []
        # one dict for both nodes, or a tuple (head's, peer's)
        th = thresholds if isinstance(thresholds, tuple) else (thresholds, thresholds)
        for k, host in enumerate(HOSTS):
            root = make_root(tmp / host)
            tree = HostTree(str(root))
            run_dir = Path(tree.run_dir(self.run_id))
            run_dir.mkdir(parents=True)
            (run_dir / "config.yaml").write_text(cfg.read_text())
            ck = tree.checkpoints(name)
            gs = GroupSpec(name="pair", nodes=HOSTS, node=k, head_addr="127.0.0.1", port=port,
                           coord_port=coord, nproc=1, env={"GLOO_SOCKET_IFNAME": "lo"},
                           node_lost_s=node_lost_s)
            spec = RunSpec(
                identity=Identity(run_id=self.run_id, run_name=name, host=host, root=str(root),
                                  python=sys.executable, lock=tree.run_lock),
                config=Config(path=str(run_dir / "config.yaml"), base=base),
                resume=Resume(checkpoint_dir=ck),
                thresholds=thresholds_of({**FAST, **(th[k] or {})}),
                budget=BudgetPolicy(**(budget or {"scale": 0.01})),
                ladders={k: tuple(v) for k, v in merge_ladders().items()},
                trainer=Bundled(fault=faults[k]), role=gs)
            (run_dir / "spec.json").write_text(json.dumps(spec.to_json()))
            self.roots.append(root)
            self.dirs.append(run_dir)
            self.ckdirs.append(Path(ck))

    def start(self) -> "Group":
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        for d in self.dirs:        # head first, as launch does
            log = open(d / "supervisor.log", "ab")
            self.procs.append(subprocess.Popen(
                supervisor_argv(sys.executable, str(d)), stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, env=env, cwd=str(d), start_new_session=True))
        return self

    def state(self, k: int) -> dict:
        p = self.dirs[k] / "state.json"
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return {}

    def events(self, k: int) -> list[ev.Event]:
        return ev.read_events((self.dirs[k] / "events.jsonl").read_text())

    def kinds(self, k: int, kind: str) -> list:
        return [e for e in self.events(k) if e.kind == kind]

    def wait_final(self, k: int, timeout: float = 400) -> dict:
        def ended():
            s = self.state(k)
            return s if s.get("status") in ("done", "failed", "stopped") and \
                self.procs[k].poll() is not None else None
        return wait_for(ended, timeout, f"node {k} to end ({self.state(k).get('status')}, "
                                        f"{self.state(k).get('last_event')})", poll=0.5)

    def lock_free_once_final(self, k: int, timeout: float = 400) -> bool:
        """Whether node k's run.lock is free the moment its state.json first says final."""
        import fcntl

        wait_for(lambda: self.state(k).get("status") in ("done", "failed", "stopped"), timeout,
                 f"node {k}'s final state", poll=0.02)
        fd = os.open(HostTree(str(self.roots[k])).run_lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    def checkpoints(self, k: int) -> list[str]:
        d = self.ckdirs[k]
        return sorted(p.name for p in d.iterdir() if p.name.startswith("step_")) \
            if d.is_dir() else []

    def kill_node(self, k: int, sig: int = signal.SIGKILL) -> None:
        """The node dies whole (or, SIGSTOP, freezes): its supervisor's session and its
        trainer's."""
        trainers = self.state(k).get("trainer_pids") or []
        for pg in [self.procs[k].pid, *trainers]:
            try:
                os.killpg(pg, sig)
            except ProcessLookupError:
                pass

    def restart_supervisor(self, k: int) -> None:
        """Start node k's supervisor again on its run dir, as systemd's Restart= would."""
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        log = open(self.dirs[k] / "supervisor.log", "ab")
        self.procs[k] = subprocess.Popen(
            supervisor_argv(sys.executable, str(self.dirs[k])), stdin=subprocess.DEVNULL,
            stdout=log, stderr=log, env=env, cwd=str(self.dirs[k]), start_new_session=True)

    def cleanup(self) -> None:
        for k, p in enumerate(self.procs):
            if p.poll() is None:
                self.kill_node(k)
                p.wait(10)


@pytest.fixture
def group(tmp_path, tiny_assets):  # noqa: F811
    made: list[Group] = []

    def make(**kw) -> Group:
        g = Group(tmp_path / f"g{len(made)}", tiny_assets, **kw)
        made.append(g)
        return g.start()
    yield make
    for g in made:
        g.cleanup()


def _steps(log: Path) -> list[int]:
    return [json.loads(ln[5:])["step"] for ln in log.read_text().splitlines()
            if ln.startswith("@dfo ") and '"kind": "step"' in ln]


def test_two_nodes_train_to_done(group):
    # a peer prints no markers (the main rank is on the head): its watchdog must not call
    # that a hang, though the run takes longer than the peer's warmup_s here (the head's
    # own warm-up keeps the generous bound: imports on busy cores may take longer than 15 s)
    g = group(name="pairdone", thresholds=(None, {"warmup_s": 15}))
    # a final state means the host is free: the next launch must not find run.lock held
    # (the head waits for its peer to leave before it says final)
    assert g.lock_free_once_final(0) and g.lock_free_once_final(1)
    head, peer = g.wait_final(0), g.wait_final(1)
    assert head["status"] == "done", head.get("reason")
    assert peer["status"] == "done", peer.get("reason")
    assert head["last_step"] == 12
    # one rendezvous per attempt, the head hosting it; the checkpoints only on the head
    a0, a1 = g.kinds(0, "attempt_start")[0].argv, g.kinds(1, "attempt_start")[0].argv
    assert "--nnodes=2" in a0 and "--rdzv-conf=is_host=1" in a0 and "--rdzv-conf=is_host=0" in a1
    assert [x for x in a0 if x.startswith("--rdzv-id")] == [x for x in a1
                                                           if x.startswith("--rdzv-id")]
    assert g.checkpoints(0) and not g.checkpoints(1)
    assert len(g.kinds(0, "attempt_start")) == len(g.kinds(1, "attempt_start")) == 1
    assert not [e for e in g.kinds(1, "watchdog")]
    dec = g.kinds(1, "group_decision")
    assert dec and dec[-1].action == "final" and dec[-1].status == "done"


def test_a_fault_on_one_node_restarts_the_whole_run_with_one_fallback(group):
    g = group(name="pairfx", faults=(None, "oom@6"))
    head, peer = g.wait_final(0), g.wait_final(1)
    assert head["status"] == "done", head.get("reason")
    assert peer["status"] == "done", peer.get("reason")
    # the cause was node 1's OOM, decided once on the head
    cause = g.kinds(0, "group_decision")[0].cause
    assert cause.cls == "oom" and cause.node == 1
    fb = g.kinds(0, "fallback")
    assert len(fb) == 1 and fb[0].step == "halve_micro_batch"
    assert [e.step for e in g.kinds(1, "fallback")] == ["halve_micro_batch"]
    s0, s1 = g.kinds(0, "attempt_start"), g.kinds(1, "attempt_start")
    assert len(s0) == len(s1) == 2
    # both nodes' attempt 2: the same overrides, the same checkpoint (the head's)
    assert s0[1].overrides == s1[1].overrides == {"train.micro_batch": 4}
    assert s0[1].resume == s1[1].resume and s0[1].resume.endswith("/step_4")
    assert s0[1].resume.startswith(str(g.roots[0]))
    assert "--train.micro_batch=4" in s1[1].argv
    assert head["overrides"] == peer["overrides"] == {"train.micro_batch": 4}
    steps = _steps(g.dirs[0] / "attempt-2.log")
    assert steps[0] == 5 and steps[-1] == 12


def test_a_lost_node_is_detected_and_the_head_gives_up_with_the_fix(group):
    g = group(name="pairlost", node_lost_s=6.0, train={"max_steps": 100000},
              checkpoint={"every": 100000})
    wait_for(lambda: (g.state(0).get("last_step") or 0) >= 2, 240, "training on the head")
    g.kill_node(1)
    head = g.wait_final(0, timeout=240)
    assert head["status"] == "failed"
    assert "node gpu2 lost (no heartbeat for" in head["reason"]
    assert "dfo launch --group pair --resume latest" in head["reason"]
    lost = g.kinds(0, "node_lost")
    assert lost and lost[0].node == 1 and lost[0].host == "gpu2"
    # detected once silent for node_lost_s, not at some later timeout
    assert lost[0].silent_s >= 6.0


def test_sigterm_to_the_head_stops_both_nodes_with_one_checkpoint(group):
    g = group(name="pairstop", train={"max_steps": 100000}, checkpoint={"every": 100000})
    wait_for(lambda: (g.state(0).get("last_step") or 0) >= 3, 240, "training on the head")
    assert g.checkpoints(0) == [] and g.checkpoints(1) == []
    os.kill(g.procs[0].pid, signal.SIGTERM)
    head, peer = g.wait_final(0, timeout=240), g.wait_final(1, timeout=240)
    assert head["status"] == "stopped" and peer["status"] == "stopped"
    assert len(g.checkpoints(0)) == 1 and g.checkpoints(1) == []
    assert len(g.kinds(0, "checkpoint")) == 1
    assert any("stop requested" in e.reason for e in g.kinds(1, "stopping"))


def test_a_lost_head_ends_the_peer_failed(group):
    g = group(name="pairhead", node_lost_s=6.0, train={"max_steps": 100000},
              checkpoint={"every": 100000})
    wait_for(lambda: (g.state(0).get("last_step") or 0) >= 2, 240, "training on the head")
    g.kill_node(0)
    peer = g.wait_final(1, timeout=240)
    assert peer["status"] == "failed"
    assert peer["reason"].startswith("lost the head node gpu1 (no answer for")
    assert procs_of(g.dirs[1]) == []


def test_a_frozen_head_ends_the_peer_without_waiting_on_its_store(group):
    # SIGSTOP: the head's sockets stay open and nothing answers (a partition, a hung host),
    # so every store call of the peer waits out OP_TIMEOUT_S instead of failing at once
    from orchestrator.supervisor.coordinator import OP_TIMEOUT_S

    g = group(name="pairfrozen", node_lost_s=6.0, train={"max_steps": 100000},
              checkpoint={"every": 100000})
    wait_for(lambda: (g.state(0).get("last_step") or 0) >= 2, 240, "training on the head")
    g.kill_node(0, signal.SIGSTOP)
    peer = g.wait_final(1, timeout=240)
    assert peer["status"] == "failed"
    assert peer["reason"].startswith("lost the head node gpu1 (no answer for")
    assert procs_of(g.dirs[1]) == []
    # once it knew, the peer ended without a store call to the frozen head (an abort, a
    # stop check, "left": each would have waited OP_TIMEOUT_S)
    lost_t = g.kinds(1, "node_lost")[0].t
    final_t = g.kinds(1, "final")[0].t
    assert final_t - lost_t < OP_TIMEOUT_S, final_t - lost_t
    # the head runs again, long after node_lost_s: it was itself not answering, and blames
    # no peer (the peer is silent because it ended, having taken the head for lost)
    g.kill_node(0, signal.SIGCONT)
    head = g.wait_final(0, timeout=240)
    assert head["status"] == "failed"
    reason = head["reason"]
    assert reason.startswith("the head gpu1 itself was not answering for "), reason
    assert "node gpu2 took the head for lost" in reason and "start it" not in reason, reason
    assert "dfo launch --group pair --resume latest" in reason
    assert procs_of(g.dirs[0]) == [] and procs_of(g.dirs[1]) == []


def test_a_stopped_trainer_on_the_peer_is_frozen_on_that_node(group):
    # SIGSTOP to node 1's torchrun and worker (not its supervisor): node 1 sees its own
    # processes stopped, the head's ranks only wait; the run's cause names node 1
    g = group(name="pairstopped", thresholds={"frozen_s": 3}, train={"max_steps": 16})
    wait_for(lambda: (g.state(0).get("last_step") or 0) >= 2, 240, "training on the head")
    stopped = procs_of(g.dirs[1])
    assert stopped
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    head, peer = g.wait_final(0), g.wait_final(1)
    assert head["status"] == "done" and peer["status"] == "done", head.get("reason")
    cause = g.kinds(0, "group_decision")[0].cause
    assert (cause.cls, cause.node, cause.host) == ("frozen", 1, "gpu2")
    assert "of the attempt stopped (state T" in cause.reason
    assert [c.cls for c in g.kinds(1, "classified")][:1] == ["frozen"]
    assert [f.step for f in g.kinds(0, "fallback")] == [None]    # the same config again
    assert head["overrides"] == peer["overrides"] == {}


def test_a_restarted_head_supervisor_says_it_lost_the_groups_state(group):
    # kill -9 of the head's supervisor alone (its trainer dies with it), then a restart as
    # systemd would: the new one has no store the peers know; it must not blame the peer
    g = group(name="pairrestart", node_lost_s=6.0, train={"max_steps": 100000},
              checkpoint={"every": 100000})
    wait_for(lambda: (g.state(0).get("last_step") or 0) >= 2, 240, "training on the head")
    os.kill(g.procs[0].pid, signal.SIGKILL)
    g.procs[0].wait(30)
    g.restart_supervisor(0)
    head, peer = g.wait_final(0, timeout=240), g.wait_final(1, timeout=240)
    assert head["status"] == "failed"
    assert head["reason"].startswith("the head's supervisor restarted during attempt 1 and "
                                     "lost the group's state"), head["reason"]
    assert "dfo launch --group pair --resume latest" in head["reason"]
    assert "gpu2 lost" not in head["reason"] and not g.kinds(0, "node_lost")
    assert peer["status"] == "failed"
    assert peer["reason"].startswith("lost the head node gpu1"), peer["reason"]
    assert procs_of(g.dirs[0]) == [] and procs_of(g.dirs[1]) == []


def procs_of(run_dir: Path) -> list[int]:
    from orchestrator.supervisor.procs import processes_of_run

    return processes_of_run(str(run_dir))


# --- the coordinator against a real store (no trainer) ------------------------------------------

def _coords(node_lost_s: float = 3.0):
    from orchestrator.supervisor.coordinator import Coordinator

    port = free_port_pair()
    gs = [GroupSpec(name="pair", nodes=HOSTS, node=k, head_addr="127.0.0.1", port=port - 1,
                    coord_port=port, nproc=1, node_lost_s=node_lost_s) for k in (0, 1)]
    head, peer = Coordinator(gs[0], "r1"), Coordinator(gs[1], "r1")
    head.open()
    peer.open()
    return head, peer


def test_coordinator_abort_is_first_come_and_stop_reaches_the_other_node():
    from dfo_contract.group_store import AttemptPlan, GroupVerdict, NodeOutcome

    head, peer = _coords()
    try:
        assert peer.abort(1, "node gpu2: fx") is True
        assert head.abort(1, "node gpu1: crash") is False
        assert head.aborted(1).node == 1 and head.aborted(2) is None
        head.set_plan(1, AttemptPlan(overrides={}, resume=None, rdzv_id="r1-a1"))
        assert peer.plan(1).rdzv_id == "r1-a1" and peer.plan(2) is None
        peer.set_end(1, NodeOutcome(node=1, host="gpu2", cls="oom", reason="r"))
        assert head.end(1, 1).cls == "oom" and head.end(1, 0) is None
        head.set_decision(1, GroupVerdict(action="final", status="done"))
        assert peer.decision(1).status == "done"
        assert head.stop_requested() is None
        peer.request_stop("SIGTERM to the supervisor (dfo stop)")
        assert head.stop_requested() == "SIGTERM to the supervisor (dfo stop) (on node gpu2)"
    finally:
        peer.close()
        head.close()


def test_coordinator_a_silent_peer_is_lost_and_the_head_gone_is_lost_to_the_peer():
    head, peer = _coords(node_lost_s=2.0)
    try:
        # each side saw the other's counter change three times (over node_lost_s at one
        # beat a second, however slowly the box runs them): beating nodes are not lost
        wait_for(lambda: head.hb.last_value.get(1, 0) >= 3 and peer.hb.last_value.get(0, 0) >= 3,
                 60, "three heartbeats each way")
        assert head.lost(time.monotonic()) == [] and peer.lost(time.monotonic()) == []
        peer._stop.set()                     # the peer's heartbeat stops
        got = wait_for(lambda: head.lost(time.monotonic()), 30, "the peer lost")
        assert got[0][0] == 1 and got[0][1] > 2.0
    finally:
        head._stop.set()
    got = wait_for(lambda: peer.lost(time.monotonic()), 30, "the head lost")
    assert got[0][0] == 0


def test_sigterm_to_a_peer_during_the_backoff_stops_the_head_too(group):
    g = group(name="pairback", faults=(None, "exit=1@3"), budget={"initial": 120.0})
    wait_for(lambda: g.state(0).get("status") == "backoff", 240, "the head's backoff")
    os.kill(g.procs[1].pid, signal.SIGTERM)
    head, peer = g.wait_final(0, timeout=120), g.wait_final(1, timeout=120)
    assert head["status"] == "stopped" and peer["status"] == "stopped"
    assert "(on node gpu2)" in head["reason"]
    assert len(g.kinds(0, "attempt_start")) == len(g.kinds(1, "attempt_start")) == 1


def test_a_restarted_member_supervisor_reports_its_abandoned_attempt_and_the_run_goes_on(
        group):
    # kill -9 of the member's supervisor alone (its trainer dies with it), then a restart as
    # systemd would: it re-joins and ends the attempt it abandoned, so the head decides
    g = group(name="pairmember", node_lost_s=20.0, checkpoint={"every": 2})
    wait_for(lambda: (g.state(0).get("last_step") or 0) >= 3, 240, "training on the head")
    os.kill(g.procs[1].pid, signal.SIGKILL)
    g.procs[1].wait(30)
    g.restart_supervisor(1)
    head, peer = g.wait_final(0, timeout=300), g.wait_final(1, timeout=300)
    assert head["status"] == "done", head.get("reason")
    assert peer["status"] == "done", peer.get("reason")
    # the head got the member's end of attempt 1, naming the cause, and decided on it
    said = "the supervisor on gpu2 died during attempt 1"
    for k in (0, 1):
        ends = [e for e in g.kinds(k, "node_end") if e.attempt == 1 and e.node == 1]
        assert len(ends) == 1 and said in ends[0].reason, (k, ends)
    dec = g.kinds(0, "group_decision")[0]
    assert dec.action == "restart" and dec.cause.node == 1 and said in \
        dec.cause.reason, dec.cause
    assert len(g.kinds(0, "attempt_start")) == len(g.kinds(1, "attempt_start")) == 2
    assert procs_of(g.dirs[0]) == [] and procs_of(g.dirs[1]) == []

