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

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..errors import ConfigError
from .fallback import FAILURE_CLASSES, TRANSIENT

DEFAULT_PER_CLASS: dict[str, int] = {
    "fx_trace_race": 5,
    "compile_hang": 5,
    "dense_fallback": 5,
    "oom": 6,
    "nccl_timeout": 5,
    "nan_loss": 3,
    "crash": 3,
}


@dataclass(frozen=True)
class BudgetPolicy:
    per_class: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_PER_CLASS))
    total: int = 12
    initial: float = 10.0
    factor: float = 2.0
    cap: float = 300.0
    healthy_reset: float = 600.0
    startup_limit: int = 3
    settle: float = 0.5
    scale: float = 1.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["per_class"] = dict(self.per_class)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "BudgetPolicy":
        d = dict(d or {})
        per = dict(DEFAULT_PER_CLASS)
        per.update(d.pop("per_class", None) or {})
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        pol = cls(per_class=per, **known)
        pol.validate()
        return pol

    def validate(self) -> None:
        for k, v in self.per_class.items():
            if k not in FAILURE_CLASSES:
                raise ConfigError(f"budget: unknown failure class {k!r}",
                                  hint="choose from " + ", ".join(FAILURE_CLASSES))
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"budget.{k}: expected a non-negative integer, got {v!r}")
        if not isinstance(self.total, int) or self.total < 0:
            raise ConfigError(f"budget.total: expected a non-negative integer, got {self.total!r}")
        if not (self.scale > 0):
            raise ConfigError(f"--backoff-scale: expected a positive number, got {self.scale!r}")


@dataclass
class BudgetState:
    counts: dict[str, int] = field(default_factory=dict)
    total: int = 0
    streak: int = 0             # restarts since the last healthy period (drives backoff)
    startup_streak: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "BudgetState":
        d = dict(d or {})
        return cls(counts=dict(d.get("counts") or {}), total=int(d.get("total", 0)),
                   streak=int(d.get("streak", 0)), startup_streak=int(d.get("startup_streak", 0)))


@dataclass(frozen=True)
class Decision:
    restart: bool
    delay: float
    reason: str


def backoff(policy: BudgetPolicy, streak: int) -> float:
    """Delay before the ``streak``-th restart in a row (1-based)."""
    d = policy.initial * (policy.factor ** max(streak - 1, 0))
    return min(d, policy.cap) * policy.scale


def restart_delay(policy: BudgetPolicy, decision: "Decision", cls: str, *,
                  config_changed: bool) -> float:
    """The wait before the restart ``decision`` allows: the backoff, or only ``settle`` when a
    new fallback changed the config of a class that is not transient."""
    if config_changed and cls not in TRANSIENT:
        return min(decision.delay, policy.settle * policy.scale)
    return decision.delay


def on_failure(policy: BudgetPolicy, state: BudgetState, cls: str, *, healthy_s: float,
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
