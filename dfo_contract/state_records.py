"""The typed parts of ``state.json`` (``runstate.RunState``'s sub-records), each read and
written by ``dfo_contract.codec``; their keys are state.json's (docs/contracts.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .codec import decode, encode, named, opt
from .own_ladder import Changes

#: the config in force of a run's attempt: the bundled trainer's overrides (flat
#: ``SECTION.FIELD`` keys -> values, as ``--set`` gives them) or what an own trainer's ladder
#: changed (:class:`~dfo_contract.own_ladder.Changes`, written with ``"kind": "own"``; a
#: mapping without ``kind`` is the bundled trainer's). The supervisor's driver passes it on
#: and compares it; only the run's trainer source reads inside it.
Overrides = dict[str, Any] | Changes


def copied(ov: Overrides) -> Overrides:
    """A copy of ``ov`` that changes to the original do not reach."""
    return ov.copy() if isinstance(ov, Changes) else dict(ov)


def config_overrides(ov: Overrides) -> dict[str, Any]:
    """The bundled trainer's flat overrides in ``ov`` (an own trainer's changes set no key
    of its config: none)."""
    return {} if isinstance(ov, Changes) else dict(ov)


def changes_of(ov: Overrides) -> Changes:
    """An own trainer's changes in ``ov`` (a mapping without ``kind`` reads as the changes
    it holds: ``{}`` before the ladder changed anything)."""
    return ov if isinstance(ov, Changes) else Changes.from_json(ov)


def set_only(ov: Overrides | None) -> dict[str, Any]:
    """What ``ov`` sets (an own command's empty ``env``/``drop`` lists, and an empty or null
    override, are the same config as none)."""
    if isinstance(ov, Changes):
        return ov.set_only()
    return {k: v for k, v in (ov or {}).items() if v not in ({}, [], None)}


@dataclass(frozen=True, kw_only=True)
class CheckpointRef:
    """The run's newest checkpoint as the trainer's marker said: ``{"step", "path"}``."""

    step: int | None = None
    path: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CheckpointRef":
        return decode(cls, d, what="a checkpoint")


@dataclass(frozen=True, kw_only=True)
class EvidenceLine:
    """A line of a failed attempt's output that made its class: the classifier's evidence
    (``orchestrator.common.classify``; ``line`` is 1-based within the lines it was given, ``rule``
    the rule that matched it), in state.json's ``evidence`` and the ``classified``,
    ``give_up`` and ``node_end`` events: ``{"line", "text", "rule"}``."""

    line: int | None = None
    text: str = ""
    rule: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "EvidenceLine":
        return decode(cls, d, what="an evidence line", tolerant=True)


@dataclass(frozen=True, kw_only=True)
class FallbackRecord:
    """One fallback a run took (an element of state.json's ``fallbacks``):
    ``{"class", "step", "changed", "attempt"}`` (``note``: why a restart was unchanged)."""

    cls: str = named("class", "")
    step: str | None = None
    changed: dict[str, Any] = field(default_factory=dict)
    attempt: int | None = None
    note: str | None = opt()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out


@dataclass(frozen=True, kw_only=True)
class ThroughputLowState:
    """While tokens/s is low without dense evidence (state.json's ``throughput_low``):
    what the host showed (``ops.host_load``), since when, in which attempt."""

    cause: str = ""
    summary: str = ""
    since: float | None = None
    attempt: int | None = None
    reason: str | None = opt()


@dataclass(kw_only=True)
class BudgetState:
    """The restart budgets spent so far (state.json's ``budget``; the decisions are
    ``orchestrator.common.budget``)."""

    counts: dict[str, int] = field(default_factory=dict)
    total: int = 0
    streak: int = 0             # restarts since the last healthy period (drives backoff)
    startup_streak: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "BudgetState":
        return decode(cls, d or {}, what="state.json's budget")
