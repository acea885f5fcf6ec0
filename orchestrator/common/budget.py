"""Restart budgets and backoff. Pure: every time is passed in, nothing sleeps here.

- A restart budget per failure class and one in total. When either is spent the run
  ends ``failed``.
- Backoff before a restart: ``initial`` seconds (10), doubling, capped at ``cap`` (5 min).
  It resets after ``healthy_reset`` seconds (10 min) of healthy training in one attempt;
  so do the per-class counts of transient classes (a rare NCCL timeout every few hours
  must not end a week-long run). Ladder positions and the total never reset.
- A failure during start-up (before the first training step) with the same config as
  the previous start-up failure counts toward ``startup_limit``; at the limit the run
  ends ``failed`` instead of looping.
- A restart that applies a new fallback (the config differs from the failed attempt's)
  waits only ``settle`` seconds (0.5), not the backoff: the failure came from the config
  and waiting cannot change it; the process has exited, so its memory is free. Transient
  classes and repeats of the same config wait the full backoff (``restart_delay``).
- ``scale`` multiplies every duration (``--backoff-scale 0.01`` for tests and the demo).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Self

from dfo_contract import exitcodes
from dfo_contract.errors import ContractError
from dfo_contract.runlimits import Budget
from dfo_contract.state_records import BudgetState, set_only

from .errors import ConfigError
from .fallback import FAILURE_CLASSES, TRANSIENT


__all__ = ["BudgetPolicy", "BudgetState", "Decision", "backoff", "restart_delay", "on_failure",
           "from_outside", "cannot_do_better", "what_to_try"]


class BudgetPolicy(Budget):
    """spec.json's ``Budget`` as a user gives it: ``from_user`` also checks each
    ``per_class`` name is a failure class, and says what is wrong as a ConfigError."""

    @classmethod
    def from_user(cls, d: Mapping[str, Any] | None, where: str = "budget", *,
                  classes: Iterable[str] | None = FAILURE_CLASSES) -> Self:
        try:
            return super().from_user(d, where, classes=classes)
        except ContractError as e:
            raise ConfigError(str(e)) from None


@dataclass(frozen=True)
class Decision:
    restart: bool
    delay: float
    reason: str


def backoff(policy: Budget, streak: int) -> float:
    """Delay before the ``streak``-th restart in a row (1-based)."""
    d = policy.initial * (policy.factor ** max(streak - 1, 0))
    return min(d, policy.cap) * policy.scale


def restart_delay(policy: Budget, decision: "Decision", cls: str, *,
                  config_changed: bool) -> float:
    """The wait before the restart ``decision`` allows: the backoff, or only ``settle`` when a
    new fallback changed the config of a class that is not transient."""
    if config_changed and cls not in TRANSIENT:
        return min(decision.delay, policy.settle * policy.scale)
    return decision.delay


def on_failure(policy: Budget, state: BudgetState, cls: str, *, healthy_s: float,
               startup: bool, same_config_as_last_startup_failure: bool = True,
               permanent: bool = False) -> Decision:
    """Record one failed attempt (mutates ``state``) and decide whether to restart.

    ``healthy_s``: seconds this attempt trained healthily (after its first step).
    ``startup``: it failed before its first training step.
    """
    if healthy_s * 1.0 >= policy.healthy_reset * policy.scale:
        state.streak = 0
        for c in TRANSIENT:
            state.counts.pop(c, None)
    if permanent:
        return Decision(False, 0.0, "a permanent error: restarting cannot help")
    if startup:
        state.startup_streak = state.startup_streak + 1 if same_config_as_last_startup_failure else 1
    else:
        state.startup_streak = 0
    state.counts[cls] = state.counts.get(cls, 0) + 1
    state.total += 1
    limit = policy.per_class.get(cls, 0)
    if state.counts[cls] > limit:
        return Decision(False, 0.0, f"restart budget for {cls} spent ({limit})")
    if state.total > policy.total:
        return Decision(False, 0.0, f"total restart budget spent ({policy.total})")
    if startup and state.startup_streak >= policy.startup_limit:
        return Decision(False, 0.0, f"{state.startup_streak} start-up failures in a row "
                                    "with the same config")
    state.streak += 1
    return Decision(True, backoff(policy, state.streak),
                    f"restart {state.counts[cls]}/{limit} for {cls}, "
                    f"{state.total}/{policy.total} in total")


#: signals a trainer does not send itself: an operator, a host's OOM killer (SIGKILL), a
#: preemption agent. An attempt ended so, with no traceback, says nothing about the code
OUTSIDE_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def from_outside(a) -> bool:
    """An attempt (``runstate.Attempt``) that ended by a signal it did not send itself, with
    no class of its own: killed by ``OUTSIDE_SIGNALS``, or the trainer's exit 6 (it saved
    and exited on a SIGTERM/SIGINT the supervisor did not send)."""
    return a.cls == "crash" and (a.signal in OUTSIDE_SIGNALS
                                 or a.signal is None and a.exit_code == exitcodes.INTERRUPTED)


def cannot_do_better(prev, cur, *, restart_changes_config: bool) -> str | None:
    """Whether another attempt cannot do better than the last two, from the attempt history
    (the run's ``runstate.Attempt`` records: class, reason, config, whether it trained):
    both failed before their first training step, with the same class and the same reason,
    under the same config, and the next restart would change nothing. Nothing was trained
    or saved in between, so a third attempt meets the same error: the run stops, saying why
    (None: restart as the budget allows). It judges tracebacks and exit statuses: an
    attempt whose compile cache grew made progress, and a ``crash`` that is a signal from
    outside (``OUTSIDE_SIGNALS``) is no error of the code; both restart as the budget
    allows."""
    if prev is None or restart_changes_config:
        return None
    if any(a.reached_train is not False or a.checkpointed is not False for a in (prev, cur)):
        return None
    if cur.cache_grew:    # its compile got further than the one before: the next starts warmer
        return None
    if any(from_outside(a) for a in (prev, cur)):
        return None       # ended from outside: says nothing about the code
    if (prev.cls, prev.reason, set_only(prev.overrides)) != (cur.cls, cur.reason,
                                                             set_only(cur.overrides)):
        return None
    return (f"attempts {prev.n} and {cur.n} failed the same way before their first training "
            "step with the same config, and nothing was trained or saved in between: another "
            "attempt cannot do better; " + what_to_try(cur.cls))


def what_to_try(cls: str) -> str:
    """What a user can change after the run stopped on ``cls`` repeating."""
    if cls == "crash":
        return ("fix the error the trainer reports at start-up (dfo logs --attempt N shows "
                "it), then dfo launch again")
    return (f"see the runbook for {cls} in docs/recovery.md, change the config (--set) or the "
            "host, then dfo launch --resume latest")
