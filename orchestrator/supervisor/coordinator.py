"""This node's connection to a multi-node run's coordination store: a
``torch.distributed.TCPStore`` the head's supervisor hosts on ``head_addr:coord_port``
(a client on the other nodes, every key under the run's prefix through a ``PrefixStore``),
and the heartbeat thread (docs/recovery.md "One run over several nodes"; key names and
messages: ``dfo_contract.group_store``; the decisions: ``orchestrator.supervisor.policy.group_decide``)."""

from __future__ import annotations

import functools
import logging
import threading
import time
from datetime import timedelta
from typing import Any, Callable, TypeVar

from dfo_contract import group_store as gk
from dfo_contract.group_store import (AttemptAbort, AttemptPlan, GroupVerdict, NodeOutcome,
                                      StoppedPids, StopRequest)

from ..common import group as g
from .policy.group_decide import Heartbeats

log = logging.getLogger("dfo")

HEARTBEAT_S = 1.0
CONNECT_S = 120.0       # a peer keeps dialling the head's store this long
OP_TIMEOUT_S = 10.0     # one store operation
STORE_POLL_S = 0.25     # how often a watch loop reads the store

M = TypeVar("M")


class Coordinator:
    """This node's connection to the run's coordination store, and its heartbeat thread.
    Every store call goes through :meth:`_op` (one lock; a failure returns None: a store
    that stays unreachable shows up as a silent heartbeat, judged by the caller). The
    heartbeat view has a lock of its own, so :meth:`lost` answers at once even while a
    store call waits out its timeout on a head that stopped answering."""

    def __init__(self, gs: g.GroupSpec, run_id: str):
        self.gs = gs
        self.run_id = run_id
        self._lock = threading.Lock()      # store calls
        self._hb_lock = threading.Lock()   # self.hb
        self._stuck: threading.Thread | None = None   # a store call that never returned
        self._stop = threading.Event()
        self._base: Any = None
        self.store: Any = None
        self.hb = Heartbeats(lost_s=gs.node_lost_s, start=time.monotonic())
        self.stop_sent = False

    # --- connection -------------------------------------------------------------------------
    def open(self) -> None:
        import torch.distributed as dist

        if self.gs.is_head:
            self._base = dist.TCPStore(self.gs.head_addr, self.gs.coord_port, is_master=True,
                                       wait_for_workers=False,
                                       timeout=timedelta(seconds=OP_TIMEOUT_S))
        else:
            self._base = dist.TCPStore(self.gs.head_addr, self.gs.coord_port, is_master=False,
                                       timeout=timedelta(seconds=CONNECT_S))
            self._base.set_timeout(timedelta(seconds=OP_TIMEOUT_S))
        self.store = dist.PrefixStore(gk.key_prefix(self.run_id), self._base)
        self.hb = Heartbeats(lost_s=self.gs.node_lost_s, start=time.monotonic())
        threading.Thread(target=self._beat, name="dfo-heartbeat", daemon=True).start()

    def close(self) -> None:
        """A peer says it is leaving (unless the head is lost); the head (whose process hosts
        the store) waits until every peer left or went silent, so none misses the final
        decision."""
        if self.store is not None and not self.gs.is_head:
            if not self.lost(time.monotonic()):   # a lost head's store would only time out
                self._op(lambda: self.store.set(gk.key_left(self.gs.node), "1"))
        elif self.store is not None:
            peers = set(range(1, self.gs.nnodes))
            deadline = time.monotonic() + max(30.0, 2 * self.gs.node_lost_s)
            while peers and time.monotonic() < deadline:
                peers -= {k for k in peers
                          if self._op(functools.partial(self.store.check, [gk.key_left(k)]))}
                peers -= {k for k, _ in self.lost(time.monotonic())}
                time.sleep(STORE_POLL_S)
        self._stop.set()

    def _op(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the store, or None after OP_TIMEOUT_S. A head that stopped answering
        without closing its sockets (frozen, partitioned) leaves a TCPStore call blocked in
        recv for good, whatever the store's timeout says; so each call runs on a thread of
        its own, and while one is stuck every call returns None at once (the heartbeat goes
        silent and the caller judges the node lost)."""
        with self._lock:
            if self._stuck is not None and self._stuck.is_alive():
                return None
            box: list[Any] = [None]

            def call() -> None:
                try:
                    box[0] = fn()
                except Exception as e:  # noqa: BLE001 - DistNetworkError, DistStoreError, timeouts
                    log.debug("coordination store: %s", e)

            th = threading.Thread(target=call, name="dfo-store-call", daemon=True)
            th.start()
            th.join(OP_TIMEOUT_S)
            if th.is_alive():
                self._stuck = th
                log.debug("coordination store: no answer in %.0f s", OP_TIMEOUT_S)
                return None
            return box[0]

    def _beat(self) -> None:
        watch = ([k for k in range(self.gs.nnodes) if k != 0] if self.gs.is_head else [0])
        while not self._stop.is_set():
            with self._hb_lock:
                self.hb.tick(time.monotonic())
            self._op(lambda: self.store.add(gk.key_heartbeat(self.gs.node), 1))
            for k in watch:
                v = self._op(functools.partial(self.store.add, gk.key_heartbeat(k), 0))
                with self._hb_lock:
                    self.hb.observe(k, v, time.monotonic())
            self._stop.wait(HEARTBEAT_S)

    # --- messages (dfo_contract.group_store) ------------------------------------------------
    def _get(self, key: str, parse: Callable[[bytes], M]) -> M | None:
        raw = self._op(lambda: self.store.get(key) if self.store.check([key]) else None)
        return parse(raw) if raw else None

    def _set(self, key: str, text: str) -> None:
        self._op(lambda: self.store.set(key, text))

    def set_plan(self, n: int, plan: AttemptPlan) -> None:
        self._set(gk.key_plan(n), plan.to_text())

    def plan(self, n: int) -> AttemptPlan | None:
        return self._get(gk.key_plan(n), AttemptPlan.from_text)

    def abort(self, n: int, reason: str) -> bool:
        """Set ``key_abort(n)`` unless set; True when this node's was the first."""
        mine = AttemptAbort(node=self.gs.node, host=self.gs.host, reason=reason).to_text()
        got = self._op(lambda: self.store.compare_set(gk.key_abort(n), "", mine))
        return got is not None and got.decode() == mine

    def aborted(self, n: int) -> AttemptAbort | None:
        return self._get(gk.key_abort(n), AttemptAbort.from_text)

    def set_end(self, n: int, end: NodeOutcome) -> None:
        self._set(gk.key_end(n, end.node), gk.end_text(end))

    def end(self, n: int, k: int) -> NodeOutcome | None:
        return self._get(gk.key_end(n, k), gk.read_end)

    def set_stopped(self, n: int, pids: tuple[int, ...]) -> None:
        """This node's stopped processes of attempt N, now."""
        self._set(gk.key_stopped(n, self.gs.node), StoppedPids(tuple(pids)).to_text())

    def stopped(self, n: int, k: int) -> tuple[int, ...]:
        """Node k's stopped processes of attempt N, as it last said (none: nothing said)."""
        got = self._get(gk.key_stopped(n, k), StoppedPids.from_text)
        return got.pids if got is not None else ()

    def set_decision(self, n: int, dec: GroupVerdict) -> None:
        self._set(gk.key_decision(n), dec.to_text())

    def decision(self, n: int) -> GroupVerdict | None:
        return self._get(gk.key_decision(n), GroupVerdict.from_text)

    def request_stop(self, reason: str) -> None:
        if not self.stop_sent:
            self._set(gk.KEY_STOP, StopRequest(node=self.gs.node, host=self.gs.host,
                                               reason=reason).to_text())
            self.stop_sent = True

    def stop_requested(self) -> str | None:
        got = self._get(gk.KEY_STOP, StopRequest.from_text)
        return got.describe() if got is not None else None

    # --- liveness -------------------------------------------------------------------------------
    def own_silent_s(self, now: float) -> float:
        """How long this node itself did not run lately (``Heartbeats.own_silent_s``)."""
        with self._hb_lock:
            return self.hb.own_silent_s(now)

    def left(self, k: int) -> bool:
        """Node k said it was leaving (``left/<k>``)."""
        return bool(self._op(lambda: self.store.check([gk.key_left(k)])))

    def lost(self, now: float) -> list[tuple[int, float]]:
        """Head: the peers silent for node_lost_s; peer: [(0, s)] when the head is."""
        nodes = [k for k in range(self.gs.nnodes) if k != 0] if self.gs.is_head else [0]
        with self._hb_lock:
            return [(k, self.hb.silent_s(k, now)) for k in self.hb.lost(nodes, now)]


