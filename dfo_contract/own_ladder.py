"""An own trainer's fallback ladder (``dfo launch -- CMD``, docs/own-trainer.md), read and
written by ``dfo_contract.codec``: a :class:`LadderStep` as a run file, a ``--ladder`` flag,
spec.json (``Own.fallbacks``) and the failure-class table write it (a one-key mapping), and
:class:`Changes`, what the ladder changed so far (state.json's ``overrides`` of such a run:
``state_records.Overrides``).
``orchestrator.common.own_trainer`` checks steps and applies them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .codec import Tagged, decode, encode, opt
from .errors import ContractError

#: a step's kinds, as a run file names them
STEP_KINDS = ("env", "set_arg", "drop_arg", "run_first")


@dataclass(frozen=True, kw_only=True)
class LadderStep:
    """One step, exactly one of: ``env`` (set variables), ``set_arg`` (replace or append
    ``FLAG VALUE``), ``drop_arg`` (remove ``FLAG`` and its value), ``run_first`` (a command
    run before each later attempt)."""

    env: dict[str, str] | None = opt()
    set_arg: dict[str, str] | None = opt()
    drop_arg: str | None = opt()
    run_first: list[str] | None = opt()

    def __post_init__(self) -> None:
        if sum(v is not None for v in (self.env, self.set_arg, self.drop_arg,
                                       self.run_first)) != 1:
            raise ContractError("a fallback step has exactly one of " + ", ".join(STEP_KINDS))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "LadderStep":
        return decode(cls, obj, what="a fallback step")


@dataclass(kw_only=True)
class Changes(Tagged):
    """What the ladder changed so far: ``env`` set, ``set_args`` replaced, ``drop`` flags
    removed, ``first`` commands run before each attempt: an own trainer's config in force
    (``state_records.Overrides``), written with ``"kind": "own"`` first. Read tolerant
    (state.json)."""

    kind: ClassVar[str] = "own"
    TOLERANT = True

    env: dict[str, str] = field(default_factory=dict)
    set_args: dict[str, str] = field(default_factory=dict)
    drop: list[str] = field(default_factory=list)
    first: list[list[str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, d: Any) -> "Changes":
        """The changes of state.json's ``overrides`` (none: nothing changed yet; a mapping
        without ``kind`` reads as the changes it holds)."""
        return decode(cls, d or {}, what="an own trainer's changes")

    def copy(self) -> "Changes":
        return Changes(env=dict(self.env), set_args=dict(self.set_args), drop=list(self.drop),
                       first=[list(c) for c in self.first])

    def set_only(self) -> dict[str, Any]:
        """The fields that change something (empty ones are the same config as none)."""
        return {k: v for k, v in encode(self, skip=("kind",)).items() if v not in ({}, [])}
