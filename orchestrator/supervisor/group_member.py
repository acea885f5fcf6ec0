"""A peer node of a group run (``supervisor.group``): it waits for the head's plan of each
attempt, runs its part, reports its end through the group store and mirrors the head's
decision."""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

from dfo_contract.group_store import AttemptPlan, GroupVerdict, NodeOutcome
from dfo_contract.runlimits import Thresholds

from .policy.group_decide import head_lost_reason, peer_step
from .coordinator import STORE_POLL_S
from .group import GroupRole
from .role import Driver, Placement
from .source import CannotStart


class GroupMember(GroupRole):
    """A peer node: attempt N when the head's plan says so, its own end, the head's
    decision. The main rank (its markers) runs on the head: the head judges hangs."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        #: the head's plan for the attempt under way
        self.plan: AttemptPlan | None = None
        #: the attempt this node's previous supervisor died during (None: none)
        self.abandoned: int | None = None
        #: the decision just followed restores the compile cache before the next attempt
        self._restore = False

    def restarted(self, attempt: int, abandoned: bool) -> str | None:
        """The group goes on: the head decides on the abandoned attempt once this node has
        reported its end (``run``)."""
        self.abandoned = attempt if abandoned else None
        return None

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
        if self.abandoned is not None:
            ended = self._report_abandoned(driver, self.abandoned)
            if ended is not None:
                return ended
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
            self.plan = plan
            try:
                out = driver.run_attempt(n, plan.overrides)
            except CannotStart as e:     # the head decides: the attempt ends everywhere
                ended = self._cannot_start(driver, n, str(e))
                if ended is not None:
                    return ended
                continue
            if out.stopped:
                return driver.final("stopped", self.stop.reason or "stopped")
            # the attempt's class here is this node's end (another node's abort, if it was)
            diag = driver.judge(n, out, name=functools.partial(self.end_name, n))
            lost = self.attempt(n).lost
            if lost:
                return driver.final("failed", self.lost_reason(lost))
            end = self.node_end(n, out, diag, cache_fault=driver.cache.fault(out, diag))
            c.set_end(n, end)
            emit(end.event(n))
            ended = self._follow(driver, n)
            if ended is not None:
                return ended
            driver.cache.scrub(n + 1, out, diag)   # as the head's loop does before a restart
            if self._restore:
                driver.cache.restore(n + 1)

    def _cannot_start(self, driver: Driver, n: int, why: str) -> int | None:
        """This node's part of attempt N cannot start (``source.cannot_start``): abort the
        attempt on every node, report that end (permanent: no restart brings the program
        back) and follow the head's decision."""
        c, gs = self._c(), self.gs
        driver.attempt_decided(n)
        c.abort(n, f"node {gs.host}: {why}")
        end = NodeOutcome(node=gs.node, host=gs.host, cls="crash", reason=why,
                          permanent=True, origin=True)
        c.set_end(n, end)
        self.record.emit(end.event(n))
        return self._follow(driver, n)

    def _report_abandoned(self, driver: Driver, n: int) -> int | None:
        """This node's previous supervisor died during attempt N (its trainer went with
        it): unless the head decided on N already, report N's end, with that cause, so the
        head decides (the head waits for every node's end), then follow the decision. The
        run's end when it ends here; None: go on with the next attempt."""
        c, gs = self._c(), self.gs
        if c.decision(n) is None and c.end(n, gs.node) is None:
            end = NodeOutcome(node=gs.node, host=gs.host, cls="crash",
                              reason=f"the supervisor on {gs.host} died during attempt {n} "
                                     "(its trainer went with it) and was restarted",
                              exit_code=None, reached_train=False, healthy_s=0.0,
                              origin=True, supervisor_died=True)
            c.set_end(n, end)
            self.record.emit(end.event(n))
        ended = self._follow(driver, n)
        if ended is None and self._restore:
            driver.cache.restore(n + 1)
        return ended

    def _follow(self, driver: Driver, n: int) -> int | None:
        """Wait for the head's decision on attempt N and mirror it; the run's end when it
        ends, else None (``_restore``: the next attempt restores the cache)."""
        gs, c, emit = self.gs, self._c(), self.record.emit
        self._restore = False
        dec = self._wait_for(lambda: c.decision(n))
        if dec is None:
            return self._gone(driver)
        step = peer_step(dec, n, node=gs.node, host=gs.host)
        for event in step.events:
            emit(event)
        driver.follow(dec.last_checkpoint, dec.last_step)   # the head's progress is the run's
        driver.next_config(step.overrides, step.fallback)
        if step.final:
            return driver.final(*step.final)
        driver.backoff()
        self._restore = bool(step.restore_cache)
        return None

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
