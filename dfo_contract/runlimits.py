"""The limits a run's supervisor works under (torch-free, stdlib only): the watchdog's
``Thresholds`` and the restart ``Budget``. Both are sections of ``spec.json``
(``dfo_contract.runspec``), read and written there by the records' codec and then checked
(:meth:`Thresholds.check`, :meth:`Budget.check`: each value's range).

``from_user`` reads them as a user gives them (``dfo launch --threshold/--budget``, a run
file): a partial mapping (absent keys keep their defaults), numbers also as text, a whole
number for a count; the same range checks. Each raises a one-line
:class:`~dfo_contract.errors.ContractError` for a value it cannot take.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Mapping, Self

from .codec import encode
from .errors import ContractError
from .failure_classes import TABLES


def fields_of(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def as_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ContractError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def as_number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ContractError(f"{where}: expected a number, got {value!r}")
    try:
        v = float(value)
    except ValueError:
        raise ContractError(f"{where}: expected a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ContractError(f"{where}: expected a finite number, got {value!r}")
    return v


def as_count(value: Any, where: str) -> int:
    """A non-negative integer (``4`` or ``4.0``, not ``4.5``)."""
    v = as_number(value, where)
    if v < 0 or v != int(v):
        raise ContractError(f"{where}: expected a non-negative integer, got {value!r}")
    return int(v)


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """When the watchdog acts (seconds unless named otherwise)."""
    warmup_s: float = 900.0         # no heartbeat/step before the first training step
    train_s: float = 300.0          # no step (or heartbeat) once training
    hang_s: float = 60.0            # no heartbeat/step and an idle process tree: stuck (0: off)
    frozen_s: float = 60.0          # a process of the attempt stopped (state T) this long (0: off)
    stop_timeout_s: float = 120.0   # SIGTERM -> checkpoint -> exit, before SIGKILL
    kill_grace_s: float = 10.0      # after a failure was seen, before SIGKILL
    live_grace_s: float = 5.0       # a fatal pattern was printed: let the trainer exit itself
    collapse_fraction: float = 0.5  # tokens/s below this fraction of the baseline: collapsed
    collapse_steps: int = 5         # ... for this many steps
    baseline_steps: int = 5         # steps the baseline is measured over
    skip_steps: int = 2             # first steps of an attempt left out of the baseline
    poll_s: float = 0.2             # how often the supervisor reads the attempt's log
    silent_s: float = 30.0          # its heartbeat (supervisor.beat) older: not responding
    standby_wait_s: float = 0.0     # wait this long for a standby still importing (0: never)
    standby_early_cpus: int = 8     # hosts with >= this many CPUs start it early (0: never)

    #: the thresholds where 0 means "off" (every other one must be positive)
    ZERO_OK: ClassVar[tuple[str, ...]] = ("skip_steps", "hang_s", "frozen_s", "standby_wait_s",
                                          "standby_early_cpus")
    _INTS: ClassVar[tuple[str, ...]] = ("collapse_steps", "baseline_steps", "skip_steps",
                                        "standby_early_cpus")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return fields_of(cls)

    #: spec.json's section refuses a key it does not know (codec)
    CLOSED: ClassVar[bool] = True

    @classmethod
    def from_user(cls, d: Mapping[str, Any] | None, where: str = "thresholds") -> Self:
        """The defaults with ``d`` (names as the fields'; numbers, also as text)."""
        d = as_mapping(d, where)
        known = cls.names()
        out: dict[str, Any] = {}
        for k, v in d.items():
            if k not in known:
                raise ContractError(f"{where}: {k!r} is unknown (known: {', '.join(known)})")
            out[k] = as_count(v, f"{where}.{k}") if k in cls._INTS else as_number(v, f"{where}.{k}")
        return cls(**out).check(where)

    def check(self, where: str = "thresholds") -> Self:
        """This record, when every value is in its range: positive, 0 only where it means
        "off" (``ZERO_OK``), finite."""
        for k in self.names():
            val = getattr(self, k)
            if not math.isfinite(val):
                raise ContractError(f"{where}.{k}: expected a finite number, got {val!r}")
            if val < 0 or (val == 0 and k not in self.ZERO_OK):
                raise ContractError(f"{where}.{k}: expected a positive number, got {val!r}"
                                    + (" (0 means off only for " + ", ".join(self.ZERO_OK) + ")"
                                       if val == 0 else ""))
        return self

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out


#: restarts allowed per failure class before the run ends failed (each class's row's ``budget``)
DEFAULT_PER_CLASS: dict[str, int] = dict(TABLES.budgets)


@dataclass(frozen=True, kw_only=True)
class Budget:
    """Restart budgets and backoff (the decisions are ``orchestrator.common.budget``)."""
    per_class: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_PER_CLASS))
    total: int = 12
    initial: float = 10.0
    factor: float = 2.0
    cap: float = 300.0
    healthy_reset: float = 600.0
    startup_limit: int = 3
    settle: float = 0.5
    scale: float = 1.0

    #: the fields that are counts
    _COUNTS: ClassVar[tuple[str, ...]] = ("total", "startup_limit")

    @classmethod
    def from_user(cls, d: Mapping[str, Any] | None, where: str = "budget", *,
                  classes: Iterable[str] | None = None) -> Self:
        """Defaults <- ``d`` (``per_class`` merges into the default table; unknown keys are
        ignored). ``classes``: the failure classes a ``per_class`` key must be one of."""
        d = dict(as_mapping(d, where))
        given = as_mapping(d.pop("per_class", None), f"{where}.per_class")
        allowed = tuple(classes) if classes is not None else None
        for k in given:
            if allowed is not None and k not in allowed:
                raise ContractError(f"{where}: unknown failure class {k!r} "
                                    f"(choose from {', '.join(allowed)})")
        per: dict[str, Any] = {**DEFAULT_PER_CLASS, **given}
        out: dict[str, Any] = {}
        for k in fields_of(cls):
            if k == "per_class" or k not in d:
                continue
            out[k] = d[k] if k in cls._COUNTS else as_number(d[k], f"{where}.{k}")
        return cls(per_class=per, **out).check(where)

    def check(self, where: str = "budget") -> Self:
        """This record, when each count is a non-negative integer and ``scale`` positive."""
        for k, v in self.per_class.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ContractError(f"{where}.{k}: expected a non-negative integer, got {v!r}")
        for k in self._COUNTS:
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ContractError(f"{where}.{k}: expected a non-negative integer, got {v!r}")
        if not self.scale > 0:
            raise ContractError(f"{where}.scale: expected a positive number, got {self.scale!r}")
        return self

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out
