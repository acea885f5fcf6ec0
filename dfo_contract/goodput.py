"""Where a run's wall time went, as a record: :class:`Goodput` (``dfo status --json``'s
``time``, the demo's recap). Computing it from a run's events is ``orchestrator.common.goodput``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

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
    lost_s: tuple[tuple[str, float], ...]   # (cause, seconds) in CAUSES order
    live: bool                               # the run has not ended (wall time up to now)
    version: int = GOODPUT_VERSION

    @property
    def goodput(self) -> float | None:
        """The share of the wall time spent in training steps (None: no wall time yet)."""
        return round(self.train_s / self.wall_s, 4) if self.wall_s > 0 else None

    @property
    def lost_total_s(self) -> float:
        return round(sum(s for _, s in self.lost_s), 3)

    def lost(self, cause: str) -> float:
        return dict(self.lost_s).get(cause, 0.0)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "wall_s": self.wall_s, "train_s": self.train_s,
                "goodput": self.goodput, "lost_s": dict(self.lost_s),
                "lost_total_s": self.lost_total_s, "live": self.live}

    @classmethod
    def from_json(cls, obj: Any) -> "Goodput":
        """``to_json``'s object -> Goodput (ValueError when it is not one); the derived keys
        (``goodput``, ``lost_total_s``) and keys it does not know are not read."""
        if not isinstance(obj, Mapping):
            raise ValueError("a goodput record is not a JSON object")
        lost = obj.get("lost_s") or {}
        if not isinstance(lost, Mapping):
            raise ValueError("a goodput record's 'lost_s' is not an object")
        try:
            return cls(wall_s=float(obj["wall_s"]), train_s=float(obj["train_s"]),
                       lost_s=tuple((str(c), float(s)) for c, s in lost.items()),
                       live=bool(obj.get("live")),
                       version=int(obj.get("version", GOODPUT_VERSION)))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a goodput record ({e})") from None

    def summary(self) -> str:
        """One line: ``goodput 71% (train 1m30s of 2m07s); lost: startup 12s, ...``."""
        g = self.goodput
        parts = ", ".join(f"{c} {seconds_text(s)}" for c, s in self.lost_s if s >= 0.5)
        head = (f"goodput {g:.0%} (training {seconds_text(self.train_s)} of "
                f"{seconds_text(self.wall_s)})" if g is not None else "goodput n/a")
        return head + (f"; lost: {parts}" if parts else "")
