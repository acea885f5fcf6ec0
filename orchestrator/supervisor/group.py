"""One run across several nodes: this node's supervisor coordinates with the others
through a ``torch.distributed.TCPStore`` the head's supervisor hosts on
``head_addr:coord_port`` (keys: ``orchestrator.ops.group``; decisions:
``orchestrator.ops.group_decide``). torchrun's own c10d store lives only as long as one
attempt's torchrun, so it cannot carry a decision between attempts; this one lives as long
as the head's supervisor, and the user's laptop is not involved.

The head runs the ordinary attempt loop (``core.Supervisor._loop``: budget, fallback and
checkpoint choice happen once, there) with the hooks below; a peer runs :func:`run_peer`:
it waits for the head's plan, runs its part, reports its end and mirrors the decision.
"""

from __future__ import annotations

import signal
import socket
import time
from typing import Any, Callable

from dfo_contract import events

from ..ops import group as g
from ..ops.classify import PEER_ABORT, Diagnosis, classify
from ..ops.group_decide import (GroupDecision, NodeEnd, head_lost_reason, lost_end,
                                node_lost_reason, peer_step, root_cause, run_healthy_s,
                                run_reached_train)
from . import procs
from .coordinator import STORE_POLL_S, Coordinator

# --- hooks for the supervisor ------------------------------------------------------------------

def local_addr(head_addr: str, port: int) -> str | None:
    """This node's own address on the way to the head: the source address the kernel picks
    for a UDP socket "connected" to it (nothing is sent). torchrun's ``--local-addr``; None
    when there is no route (torchrun then falls back to the hostname)."""
    try:
        fam = socket.AF_INET6 if ":" in head_addr else socket.AF_INET
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect((head_addr, port))
            return str(s.getsockname()[0])
    except OSError:
        return None


def open_for(sup) -> Coordinator:
    gs: g.GroupSpec = sup.group
    c = Coordinator(gs, sup.spec.identity.run_id)
    c.open()
    sup.emit(events.GroupStart(node=gs.node, host=gs.host, nodes=list(gs.nodes),
                               head_addr=gs.head_addr, coord_port=gs.coord_port))
    return c


def lost_reason(sup, lost: list[tuple[int, float]]) -> str:
    gs: g.GroupSpec = sup.group
    k, s = lost[0]
    return head_lost_reason(gs.nodes[0], s) if not gs.is_head else \
        node_lost_reason(gs.nodes[k], s, gs.name)


def sync_stop(sup) -> None:
    """A SIGTERM here reaches every node (KEY_STOP); one there reaches this node."""
    c: Coordinator = sup.coord
    if sup.stop_reason:
        c.request_stop(sup.stop_reason)
    else:
        why = c.stop_requested()
        if why:
            sup.stop_reason = f"stop requested: {why}"


def wait_for(sup, get: Callable[[], Any], n: int, *, watch_lost: bool = True) -> Any:
    """Poll ``get`` until it answers; None when a stop came or (``watch_lost``) a node the
    caller depends on went silent (``sup.group_lost`` says which)."""
    c: Coordinator = sup.coord
    while True:
        sync_stop(sup)
        if sup.stop_reason:
            return None
        v = get()
        if v is not None:
            return v
        lost = c.lost(time.monotonic()) if watch_lost else []
        if lost:
            sup.group_lost = lost
            return None
        time.sleep(STORE_POLL_S)


def tick(sup, n: int, proc, out, dog, now: float) -> None:
    """Once per watch poll: stop, a peer's abort, this node's own failure, a lost node."""
    c: Coordinator = sup.coord
    if now < getattr(out, "store_next", 0.0):
        _kill_due(sup, proc, out, now)
        return
    out.store_next = now + STORE_POLL_S
    if out.lost is None:   # a lost node's store (the head's) would only time out
        sync_stop(sup)
    if out.stopped or sup.stop_reason:
        return
    gs: g.GroupSpec = sup.group
    if out.peer_abort is None and out.lost is None:
        if dog.term_at is not None or dog.hang:
            if not out.abort_set:
                out.abort_set = True
                out.origin = c.abort(n, f"node {gs.host}: {dog.hang or 'a fatal line'}")
        else:
            r = c.aborted(n)
            if r and int(r.get("node", -1)) != gs.node:
                out.peer_abort = f"node {r.get('host')} aborted attempt {n}: {r.get('reason')}"
                sup.emit(events.PeerAbort(attempt=n, node=gs.node, host=gs.host,
                                          reason=out.peer_abort))
                _terminate(sup, proc, out, now)
            else:
                lost = c.lost(now)
                if lost:
                    out.lost = lost
                    why = lost_reason(sup, lost)
                    for k, s in lost:
                        sup.emit(events.NodeLost(attempt=n, node=k, host=gs.nodes[k],
                                                 silent_s=round(s, 1), reason=why))
                    if gs.is_head:   # a peer that lost the head has no store to tell
                        c.abort(n, why)
                    _terminate(sup, proc, out, now)
    _kill_due(sup, proc, out, now)


def _terminate(sup, proc, out, now: float) -> None:
    procs.signal_all([proc.pid], signal.SIGTERM)
    out.kill_at = now + float(sup.t.kill_grace_s)


def _kill_due(sup, proc, out, now: float) -> None:
    if out.kill_at is not None and now >= out.kill_at and proc.poll() is None:
        procs.kill_tree(proc.pid, sup.run_dir, sig=signal.SIGKILL)
        out.kill_at = now + 2.0


def after_watch(sup, n: int, out) -> None:
    """The attempt's process is gone: a stop that came meanwhile; else, unless it finished
    training, tell the others (the first to abort is the origin)."""
    c: Coordinator = sup.coord
    sync_stop(sup)
    if sup.stop_reason and not out.stopped and out.exit_code != 0:
        out.stopped = True
    if out.stopped or out.exit_code == 0 or out.abort_set:
        return
    out.abort_set = True
    how = f"signal {out.signal}" if out.signal else f"exit {out.exit_code}"
    mine = c.abort(n, f"node {sup.group.host}: attempt {n} ended ({how})")
    out.origin = out.origin or (mine and out.peer_abort is None)


def node_end(sup, n: int, out, diag: Diagnosis) -> NodeEnd:
    gs: g.GroupSpec = sup.group
    if out.lost and gs.is_head:
        cls, reason = "crash", "stopped: a node was lost"
    elif out.peer_abort and not out.origin:
        cls, reason = PEER_ABORT, out.peer_abort
    else:
        cls, reason = diag.cls, diag.reason
    return NodeEnd(node=gs.node, host=gs.host, cls=cls, reason=reason,
                   exit_code=out.exit_code, reached_train=out.reached_train,
                   healthy_s=round(out.healthy_s, 3),
                   permanent=diag.permanent and cls == diag.cls, origin=bool(out.origin),
                   evidence=tuple(e.to_json() for e in diag.evidence))


def settle_head(sup, n: int, out, diag: Diagnosis) -> Diagnosis:
    """Head: every node's end of attempt N (a silent node: ``node_lost``), one root cause.
    Updates ``out`` (healthy_s, reached_train) to the run's."""
    c: Coordinator = sup.coord
    gs: g.GroupSpec = sup.group
    own = node_end(sup, n, out, diag)
    c.set_end(n, own)
    ends = {0: own}
    for k, s in (out.lost or []):
        ends[k] = lost_end(k, gs.nodes[k], s, gs.name)
    sup.emit(own.event(n))
    while len(ends) < gs.nnodes:
        sup.group_lost = []
        for k in range(1, gs.nnodes):
            if k not in ends:
                e = c.end(n, k)
                if e is not None:
                    ends[k] = e
                    sup.emit(e.event(n))
        if len(ends) == gs.nnodes:
            break
        sync_stop(sup)
        if sup.stop_reason:
            out.stopped = True
            return diag
        for k, s in c.lost(time.monotonic()):
            if k not in ends:
                ends[k] = lost_end(k, gs.nodes[k], s, gs.name)
                sup.emit(events.NodeLost(attempt=n, node=k, host=gs.nodes[k],
                                         silent_s=round(s, 1), reason=ends[k].reason))
        time.sleep(STORE_POLL_S)
    root = root_cause(list(ends.values()))
    sup.group_cause = root.to_json()
    out.healthy_s = run_healthy_s(list(ends.values()))
    out.reached_train = run_reached_train(list(ends.values()))
    if root.node == 0 and root.cls == diag.cls:
        return diag
    return Diagnosis(root.cls, f"node {root.host}: {root.reason}", permanent=root.permanent)


def decide(sup, n: int, action: str, *, status: str = "", reason: str = "",
           fallback: events.Fallback | None = None,
           restart: events.Restart | None = None) -> None:
    """Head: publish the run's decision on attempt N (and record it here too)."""
    gs: g.GroupSpec = sup.group
    dec = GroupDecision(action=action, cause=dict(getattr(sup, "group_cause", None) or {}),
                        status=status, reason=reason, overrides=dict(sup.state.overrides),
                        fallback=fallback.body() if fallback else None,
                        restart=restart.body() if restart else None,
                        last_checkpoint=sup.state.last_checkpoint,
                        last_step=sup.state.last_step)
    sup.coord.set_decision(n, dec)
    sup.group_decided = n
    sup.emit(events.GroupDecision(attempt=n, node=gs.node, host=gs.host, action=dec.action,
                                  status=dec.status, reason=dec.reason, cause=dec.cause))


def on_final(sup, status: str, reason: str) -> None:
    """This node's run ends: a stop reaches every node; the head's final word goes to the
    attempt the peers wait on (the next one when this one was already decided: a stop
    during the backoff)."""
    if status == "stopped":
        sup.coord.request_stop(reason)
    if sup.group.is_head and sup.state.attempt:
        n = int(sup.state.attempt)
        decide(sup, n + 1 if getattr(sup, "group_decided", 0) >= n else n, "final",
               status=status, reason=reason)


def plan_for(sup, n: int, resume: str | None) -> None:
    """Head: what every node runs as attempt N."""
    sup.coord.set_plan(n, {"overrides": dict(sup.state.overrides), "resume": resume,
                           "rdzv_id": sup.group.rdzv_id(sup.spec.identity.run_id, n)})


# --- a peer's loop ------------------------------------------------------------------------------

def run_peer(sup) -> int:
    """A peer node: attempt N when the head's plan says so, its own end, the head's decision."""
    gs: g.GroupSpec = sup.group
    c: Coordinator = sup.coord
    while True:
        if sup.stop_reason:
            return sup._final("stopped", sup.stop_reason)
        n = int(sup.state.attempt) + 1
        plan = wait_for(sup, lambda: c.plan(n) or c.decision(n), n)
        if plan is None:
            return _gone(sup)
        if isinstance(plan, GroupDecision):     # the head ended the run between attempts
            step = peer_step(plan, n, node=gs.node, host=gs.host)
            for event in step.events:
                sup.emit(event)
            return sup._final(*(step.final or ("stopped", plan.reason)))
        sup.state.overrides = dict(plan.get("overrides") or {})
        sup.plan = plan
        sup.state.status = "running"
        out = sup._run_attempt(n)
        if out.stopped:
            return sup._final("stopped", sup.stop_reason or "stopped")
        diag = classify(out.scan, exit_code=out.exit_code, signal=out.signal, hang=out.hang,
                        oom_killed=out.oom_killed, collapse=out.collapse)
        att = sup.state.attempts[-1]
        end = node_end(sup, n, out, diag)
        att.cls, att.reason = end.cls, end.reason
        sup.emit(events.Classified(attempt=n, cls=end.cls, reason=end.reason,
                                   evidence=list(end.evidence), also=list(diag.also)))
        if out.lost:
            return sup._final("failed", lost_reason(sup, out.lost))
        c.set_end(n, end)
        sup.emit(end.event(n))
        dec = wait_for(sup, lambda: c.decision(n), n)
        if dec is None:
            return _gone(sup)
        step = peer_step(dec, n, node=gs.node, host=gs.host)
        for event in step.events:
            sup.emit(event)
        sup.state.overrides = step.overrides
        if dec.last_checkpoint:
            sup.state.last_checkpoint = dec.last_checkpoint
        if dec.last_step is not None:
            sup.state.last_step = dec.last_step
        if step.fallback:
            sup.state.fallbacks.append(step.fallback)
        if step.final:
            return sup._final(*step.final)
        sup.state.status = "backoff"
        sup.save()
        if step.restore_cache:
            sup._restore_cache(n + 1)


def _gone(sup) -> int:
    lost = getattr(sup, "group_lost", None)
    if lost and not sup.stop_reason:
        return sup._final("failed", lost_reason(sup, lost))
    return sup._final("stopped", sup.stop_reason or "stopped")

