"""Stage timing for ``dfo deploy``: each stage is timed and reported through
``on_event(stage, status, seconds, detail)`` (status: ``start``, ``line``, ``done``,
``skip``, ``fail``); a display problem never breaks a deploy. ``finish`` completes a
command's ``DeployReport`` from the clock."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

from dfo_contract.env_fingerprint import EnvFingerprint

from ..plan.deploy_plan import STAGES

log = logging.getLogger("dfo")

EventFn = Callable[[str, str, "float | None", str], None]


@dataclass
class StageResult:
    stage: str
    status: str = "pending"  # done | skipped | failed | pending
    seconds: float = 0.0
    detail: str = ""


@dataclass
class DeployReport:
    host: str
    profile: str
    env: str
    action: str
    message: str = ""
    stages: list[StageResult] = field(default_factory=list)
    fingerprint: EnvFingerprint | None = None
    drift: list[str] = field(default_factory=list)
    total_seconds: float = 0.0
    ok: bool = True
    env_bytes: int | None = None  # the env's size on disk after an install (du -sk)
    cached: bool = False          # launch: the env's recorded verification held (no probe)
    dfo_only: str | None = None   # launch: only dfo's own wheel differs; the one installed

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["stages"] = [asdict(s) for s in self.stages]
        d["fingerprint"] = self.fingerprint.to_json() if self.fingerprint is not None else None
        return d


class StageClock:
    """The stages of one command: when each began, how long it took, how it ended."""

    def __init__(self, on_event: EventFn | None = None):
        self.on_event = on_event or (lambda *a: None)
        self.stages: dict[str, StageResult] = {}
        self.t0 = time.monotonic()

    def restart(self) -> None:
        self.t0 = time.monotonic()

    def emit(self, stage: str, status: str, seconds: float | None = None, detail: str = "") -> None:
        try:
            self.on_event(stage, status, seconds, detail)
        except Exception:  # noqa: BLE001 - a display problem must not break a deploy
            log.debug("event callback failed", exc_info=True)

    def begin(self, stage: str, detail: str = "") -> float:
        self.stages.setdefault(stage, StageResult(stage))
        self.emit(stage, "start", None, detail)
        return time.monotonic()

    def end(self, stage: str, t: float, detail: str = "", status: str = "done") -> None:
        sr = self.stages.setdefault(stage, StageResult(stage))
        sr.seconds += time.monotonic() - t
        sr.status = status
        sr.detail = detail or sr.detail
        self.emit(stage, "done" if status == "done" else "fail", sr.seconds, sr.detail)

    def skip(self, stage: str, detail: str) -> None:
        sr = self.stages.setdefault(stage, StageResult(stage))
        if sr.status == "pending":
            sr.status, sr.detail = "skipped", detail
        self.emit(stage, "skip", 0.0, detail)

    def results(self, order: Iterable[str]) -> list[StageResult]:
        """The stages in ``order`` (unknown ones last), seconds rounded to ms."""
        rank = {s: i for i, s in enumerate(order)}
        out = sorted(self.stages.values(), key=lambda s: rank.get(s.stage, 99))
        for s in out:
            s.seconds = round(s.seconds, 3)
        return out

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)


def finish(report: DeployReport, clock: StageClock, fp: EnvFingerprint | None, *,
           env_bytes: int | None = None) -> DeployReport:
    """``report`` completed: the env's fingerprint and size, each stage's time, the total."""
    report.fingerprint = fp
    report.env_bytes = env_bytes
    report.stages = clock.results(STAGES)
    report.total_seconds = clock.elapsed()
    return report
