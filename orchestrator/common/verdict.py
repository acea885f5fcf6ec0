"""The ladder choice: what the next attempt changes after a failure of one class. Pure.

One function, :func:`choose`, answers for the supervisor (``supervisor.source``) and for
``dfo diagnose``, so the two never disagree. Its inputs are a :class:`Ladders` (the run's
trainer kind, its ladders and its base config: :meth:`Ladders.from_spec` for a run,
:meth:`Ladders.assumed` when a log is diagnosed without its run) and the run's state (the
class's ladder position and the overrides in force).

- the bundled trainer: ``common.fallback.next_config`` over ``spec.ladders``;
- an own command (``dfo launch -- CMD``): ``common.own_trainer.next_step`` over the run file's
  ``fallbacks``. For the classes of the threaded lazy-compile race (``fx_trace_race``,
  ``compile_hang``) a spent (or absent) ladder restarts the command unchanged from its newest
  checkpoint instead of giving up: the class's budget bounds the retries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from dfo_contract.own_ladder import LadderStep
from dfo_contract.state_records import Overrides, changes_of, config_overrides
from dfo_contract.failure_classes import TABLES

from . import own_trainer
from .fallback import DEFAULT_LADDERS, next_config

VERSION = 1

#: an own command's classes that restart unchanged once their ladder is spent
OWN_RETRY = TABLES.own_retry
RETRY_NOTE = "restart unchanged: a cold-cache race often clears on retry"
#: an own command's step for a class its run file has no ladder for: what any torch
#: program honours without knowing dfo
OWN_DEFAULT = TABLES.own_ladders


@dataclass(frozen=True)
class Verdict:
    """The next config for a class. ``step`` is None when the command restarts unchanged;
    ``exhausted``: nothing is left to try, the run ends failed (``spent`` is the ladder)."""

    cls: str
    step: str | None
    overrides: Overrides
    position: int
    changed: dict
    restore_cache: bool = False
    exhausted: bool = False
    spent: str = ""
    note: str = ""
    version: int = VERSION

    def to_json(self) -> dict:
        return {"version": self.version, "class": self.cls, "step": self.step,
                "position": self.position, "changed": dict(self.changed),
                "restore_cache": self.restore_cache, "exhausted": self.exhausted,
                "note": self.note or None}


@dataclass(frozen=True)
class Ladders:
    """What a choice depends on besides the run's state. ``own``: ``own_steps`` holds the run
    file's ladders (class -> steps); else ``bundled`` (class -> step names) and ``base`` (the
    run config without overrides, flat dotted keys)."""

    own: bool = False
    bundled: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    base: Mapping[str, Any] = field(default_factory=dict)
    own_steps: Mapping[str, tuple[LadderStep, ...]] = field(default_factory=dict)
    version: int = VERSION

    @classmethod
    def from_spec(cls, spec) -> "Ladders":
        """A run's ladders, from its ``dfo_contract.runspec.RunSpec``."""
        from dfo_contract.runspec import Own

        tr = spec.trainer
        if isinstance(tr, Own):
            return cls(own=True, own_steps=dict(tr.fallbacks))
        base = dict(spec.config.base)
        if spec.group is not None:   # every node of a group runs ddp, whatever the config says
            base["parallel.layout"] = "ddp"
        return cls(bundled={k: tuple(v) for k, v in spec.ladders.items()}, base=base)

    @classmethod
    def assumed(cls, base: Mapping[str, Any]) -> "Ladders":
        """The bundled trainer's default ladders over ``base`` (a log without its run)."""
        return cls(bundled={k: tuple(v) for k, v in DEFAULT_LADDERS.items()}, base=dict(base))


def choose(ladders: Ladders, cls: str, position: int, overrides: Overrides) -> Verdict:
    """The supervisor's choice after an attempt of class ``cls`` failed (``overrides``: the
    config in force, the bundled trainer's overrides or an own trainer's changes)."""
    if not ladders.own:
        c = next_config(cls, list(ladders.bundled.get(cls, ())), position,
                        dict(ladders.base), config_overrides(overrides))
        return Verdict(cls, c.step, dict(c.overrides), c.position, dict(c.changed),
                       c.restore_cache, c.exhausted, c.spent)
    steps = list(ladders.own_steps.get(cls) or OWN_DEFAULT.get(cls, ()))
    o = own_trainer.next_step(cls, steps, position, changes_of(overrides))
    spent = " -> ".join(own_trainer.describe_step(s) for s in steps) or "empty"
    if o.exhausted and cls in OWN_RETRY:
        return Verdict(cls, None, o.changes, o.position, {}, spent=spent, note=RETRY_NOTE)
    return Verdict(cls, o.step, o.changes, o.position, dict(o.changed), False, o.exhausted,
                   spent)


def position_before(ladders: Ladders, cls: str,
                    earlier: Iterable[tuple[str, Overrides]]) -> int:
    """The ladder position of ``cls`` before an attempt, replayed from the earlier attempts
    that fell back: ``(class, overrides the attempt ran with)`` each, in order."""
    pos = 0
    for c, ov in earlier:
        if c == cls:
            pos = choose(ladders, c, pos, ov).position
    return pos
