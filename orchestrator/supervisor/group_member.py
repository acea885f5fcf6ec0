"""A peer node of a group run (``supervisor.group``): it waits for the head's plan of each
attempt, runs its part, reports its end through the group store and mirrors the head's
decision."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from dfo_contract import events
from dfo_contract.group_store import AttemptPlan, GroupVerdict
from dfo_contract.runlimits import Thresholds

from ..ops.classify import classify
from ..ops.group_decide import head_lost_reason, peer_step
from .coordinator import STORE_POLL_S
from .group import GroupRole
from .role import Driver, Placement


class GroupMember(GroupRole):
    """A peer node: attempt N when the head's plan says so, its own end, the head's
    decision. The main rank (its markers) runs on the head: the head judges hangs."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        #: the head's plan for the attempt under way
        self.plan: AttemptPlan | None = None

    def thresholds(self, t: Thresholds) -> Thresholds:
        # a peer judges only its own process (exit, fatal lines, OOM, a stopped process:
        # frozen_s stays, so the run names the node where it happened)
        return dataclasses.replace(t, warmup_s=1e12, train_s=1e12, hang_s=0.0)

    def lost_reason(self, lost: list[tuple[int, float]]) -> str:
        return head_lost_reason(self.gs.nodes[0], lost[0][1])

    def place(self, n: int, find_resume: Callable[[], str | None]) -> Placement:
        return self._placement(n, find_resume() if self.plan is None
                               else self.plan.resume)

    def run(self, driver: Driver) -> int:
        gs, c, state, emit = self.gs, self._c(), self.record.state, self.record.emit
        while True:
            if self.stop.reason:
                return driver.final("stopped", self.stop.reason)
            n = int(state.attempt) + 1
            plan = self._wait_for(lambda: c.plan(n) or c.decision(n))  # noqa: B023 - waited for here
            if plan is None:
                return self._gone(driver)
            if isinstance(plan, GroupVerdict):     # the head ended the run between attempts
                step = peer_step(plan, n, node=gs.node, host=gs.host)
                for event in step.events:
                    emit(event)
                return driver.final(*(step.final or ("stopped", plan.reason)))
            state.overrides = dict(plan.overrides)
            self.plan = plan
            state.status = "running"
            out = driver.run_attempt(n)
            if out.stopped:
                return driver.final("stopped", self.stop.reason or "stopped")
            diag = classify(out.scan, exit_code=out.exit_code, signal=out.signal,
                            hang=out.hang, oom_killed=out.oom_killed, oom_reason=out.oom_reason,
                            collapse=out.collapse,
                            frozen=out.frozen)
            att = state.attempts[-1]
            end = self.node_end(n, out, diag, cache_fault=driver.cache.fault(out, diag))
            att.cls, att.reason = end.cls, end.reason
            emit(events.Classified(attempt=n, cls=end.cls, reason=end.reason,
                                   evidence=list(end.evidence), also=list(diag.also)))
            if out.lost:
                return driver.final("failed", self.lost_reason(out.lost))
            c.set_end(n, end)
            emit(end.event(n))
            dec = self._wait_for(lambda: c.decision(n))  # noqa: B023 - waited for here
            if dec is None:
                return self._gone(driver)
            step = peer_step(dec, n, node=gs.node, host=gs.host)
            for event in step.events:
                emit(event)
            state.overrides = step.overrides
            if dec.last_checkpoint:
                state.last_checkpoint = dec.last_checkpoint
            if dec.last_step is not None:
                state.last_step = dec.last_step
            if step.fallback:
                state.fallbacks.append(step.fallback)
            if step.final:
                return driver.final(*step.final)
            state.status = "backoff"
            self.record.save()
            driver.cache.scrub(n + 1, out, diag)   # as the head's loop does before a restart
            if step.restore_cache:
                driver.cache.restore(n + 1)

    def _wait_for(self, get: Callable[[], Any]) -> Any:
        """Poll ``get`` until it answers; None when a stop came or the head went silent
        (``lost`` says so)."""
        c = self._c()
        while True:
            self.sync_stop()
            if self.stop.reason:
                return None
            v = get()
            if v is not None:
                return v
            lost = c.lost(time.monotonic())
            if lost:
                self.lost = lost
                return None
            time.sleep(STORE_POLL_S)

    def _gone(self, driver: Driver) -> int:
        if self.lost and not self.stop.reason:
            return driver.final("failed", self.lost_reason(self.lost))
        return driver.final("stopped", self.stop.reason or "stopped")
