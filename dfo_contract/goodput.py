"""Where a run's wall time went, as a record: :class:`Goodput` (``dfo status --json``'s
``time``, the demo's recap). Computing it from a run's events is ``orchestrator.common.goodput``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .codec import decode, encode

#: the format of ``Goodput.to_json`` (``dfo status --json``'s ``time``)
GOODPUT_VERSION = 1

#: the causes of lost time, in the order they are shown
CAUSES = ("startup", "compile", "detection", "restart", "redone", "other")


def seconds_text(s: float) -> str:
    """A duration for a person: ``8.4 s`` under a minute, else ``4m07s``."""
    if s < 59.95:
        return f"{s:.1f} s"
    n = int(round(s))
    return f"{n // 60}m{n % 60:02d}s"


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    train_s: float
    lost_s: dict[str, float]                 # cause -> seconds, in CAUSES order
    live: bool                               # the run has not ended (wall time up to now)
    version: int = GOODPUT_VERSION

    #: the share of the wall time spent in training steps (None: no wall time yet); derived
    goodput: float | None = field(init=False, default=None)
    #: the seconds lost over all causes; derived
    lost_total_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "goodput",
                           round(self.train_s / self.wall_s, 4) if self.wall_s > 0 else None)
        object.__setattr__(self, "lost_total_s", round(sum(self.lost_s.values()), 3))

    def lost(self, cause: str) -> float:
        return self.lost_s.get(cause, 0.0)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "Goodput":
        """``to_json``'s object -> Goodput (ContractError, a ValueError, when it is not one);
        the derived keys and keys it does not know are not read."""
        return decode(cls, obj, what="a goodput record")

    def summary(self) -> str:
        """One line: ``goodput 71% (train 1m30s of 2m07s); lost: startup 12s, ...``."""
        g = self.goodput
        parts = ", ".join(f"{c} {seconds_text(s)}" for c, s in self.lost_s.items() if s >= 0.5)
        head = (f"goodput {g:.0%} (training {seconds_text(self.train_s)} of "
                f"{seconds_text(self.wall_s)})" if g is not None else "goodput n/a")
        return head + (f"; lost: {parts}" if parts else "")
