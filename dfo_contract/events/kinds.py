"""The kinds of ``events.jsonl`` record one run's supervisor writes, one frozen ``kw_only``
dataclass each, with its ``describe()`` line (the public API and the list of every kind are
``dfo_contract.events``; the field rules are ``events.base``; a group run's kinds are
``events.group_kinds``). Required fields have no default; ``opt()`` fields may be absent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..state_records import CheckpointRef, EvidenceLine, Overrides
from .base import EventBase, opt, req


# --- one run's supervisor -------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class SupervisorStart(EventBase):
    kind: ClassVar[str] = "supervisor_start"
    pid: int
    mode: str | None
    resumed: bool

    def describe(self) -> str:
        return f"supervisor started ({self.mode}, pid {self.pid})" + \
            (" - resumed after supervisor restart" if self.resumed else "")


@dataclass(frozen=True, kw_only=True)
class OrphansReaped(EventBase):
    kind: ClassVar[str] = "orphans_reaped"
    pids: list[int]

    def describe(self) -> str:
        return f"reaped orphaned trainer processes {self.pids}"


@dataclass(frozen=True, kw_only=True)
class AttemptStart(EventBase):
    kind: ClassVar[str] = "attempt_start"
    attempt: int
    resume: str | None
    overrides: Overrides
    argv: list[str]
    pid: int
    log: str

    def describe(self) -> str:
        r = self.resume
        return f"attempt {self.attempt} started" + (f", resuming {r}" if r else ", from scratch")


@dataclass(frozen=True, kw_only=True)
class Checkpoint(EventBase):
    kind: ClassVar[str] = "checkpoint"
    attempt: int
    #: as the trainer's marker said (``trainer_markers.CheckpointMarker``)
    step: int | None
    path: str | None

    def describe(self) -> str:
        return f"checkpoint step {self.step}"


@dataclass(frozen=True, kw_only=True)
class Eval(EventBase):
    kind: ClassVar[str] = "eval"
    attempt: int
    #: as the trainer's ``eval`` marker said (``trainer_markers.EvalMarker``)
    step: int | None
    accept_len: float | None
    best_accept_len: float | None

    def describe(self) -> str:
        return f"eval at step {self.step}: acceptance length {self.accept_len}"


@dataclass(frozen=True, kw_only=True)
class Watchdog(EventBase):
    kind: ClassVar[str] = "watchdog"
    attempt: int
    reason: str                # a hang, a collapse, a live pattern, a skipped checkpoint

    def describe(self) -> str:
        return f"watchdog: {self.reason}"


@dataclass(frozen=True, kw_only=True)
class ConfigEdited(EventBase):
    kind: ClassVar[str] = "config_edited"
    attempt: int
    #: ``SECTION.FIELD`` -> [the value at launch, the value in the edited file]
    changed: dict[str, Any]

    def describe(self) -> str:
        def change(v) -> str:
            return f"{v[0]!r} -> {v[1]!r}" if isinstance(v, (list, tuple)) and len(v) == 2 \
                else repr(v)
        what = ", ".join(f"{k} {change(v)}" for k, v in sorted(self.changed.items())[:4])
        more = f" and {len(self.changed) - 4} more" if len(self.changed) > 4 else ""
        return (f"config.yaml was edited after launch ({what or 'formatting only'}{more}); "
                "this run keeps the config it was launched with (to train with the edit: "
                "dfo launch --resume latest with that config)")


@dataclass(frozen=True, kw_only=True)
class ThroughputLow(EventBase):
    kind: ClassVar[str] = "throughput_low"
    attempt: int
    reason: str
    cause: str                 # host_busy | gpu_shared | unknown (supervisor.policy.host_load)
    causes: list[str]
    seen: dict[str, Any]       # the numbers the cause was judged from
    summary: str

    def describe(self) -> str:
        return (f"throughput low ({self.cause}): {self.summary}; no restart, "
                f"config unchanged")


@dataclass(frozen=True, kw_only=True)
class ThroughputOk(EventBase):
    kind: ClassVar[str] = "throughput_ok"
    attempt: int
    reason: str

    def describe(self) -> str:
        return f"throughput back: {self.reason}"


@dataclass(frozen=True, kw_only=True)
class Stacks(EventBase):
    kind: ClassVar[str] = "stacks"
    attempt: int
    files: list[str]

    def describe(self) -> str:
        return f"stacks saved: {', '.join(self.files or []) or 'none'}"


@dataclass(frozen=True, kw_only=True)
class CacheRestore(EventBase):
    kind: ClassVar[str] = "cache_restore"
    attempt: int
    ok: bool
    detail: str

    def describe(self) -> str:
        return f"compile cache: {self.detail}"


@dataclass(frozen=True, kw_only=True)
class RunFirst(EventBase):
    """Your own trainer's ladder ran its ``run_first`` commands before the attempt."""
    kind: ClassVar[str] = "run_first"
    attempt: int
    commands: list[list[str]]
    ok: bool
    detail: str

    def describe(self) -> str:
        return (f"ran first: {'; '.join(' '.join(c) for c in self.commands or [])}"
                + ("" if self.ok else f" (failed: {self.detail})"))


@dataclass(frozen=True, kw_only=True)
class AttemptEnd(EventBase):
    kind: ClassVar[str] = "attempt_end"
    attempt: int
    exit_code: int | None
    signal: int | None
    duration_s: float
    reached_train: bool | None = opt()
    #: set when the attempt was abandoned (its supervisor died), no exit code known
    note: str | None = opt()
    #: where the attempt's time went, from the trainer's markers (epoch seconds ``*_t``):
    #: when its training loop began and how long of the time before it was warm-up compile,
    #: the step it started from, and its first and last step reports
    loop_t: float | None = opt()
    warmup_s: float | None = opt()
    from_step: int | None = opt()
    first_step: int | None = opt()
    first_step_t: float | None = opt()
    last_step: int | None = opt()
    last_step_t: float | None = opt()

    def describe(self) -> str:
        if self.signal:
            how = f"signal {self.signal}"
        elif self.exit_code is not None:
            how = f"exit {self.exit_code}"
        else:   # abandoned: its supervisor died and no one saw it end
            how = f"no exit status ({self.note})" if self.note else "no exit status"
        return f"attempt {self.attempt} ended: {how} after {self.duration_s:.0f}s"


@dataclass(frozen=True, kw_only=True)
class Classified(EventBase):
    kind: ClassVar[str] = "classified"
    attempt: int
    cls: str = req(json="class")
    reason: str
    evidence: list[EvidenceLine]     # the classifier's lines: {line, text, rule}
    also: list[str]

    def describe(self) -> str:
        return f"attempt {self.attempt} classified {self.cls}: {self.reason}"


@dataclass(frozen=True, kw_only=True)
class Fallback(EventBase):
    kind: ClassVar[str] = "fallback"
    attempt: int
    cls: str = req(json="class")
    step: str | None
    changed: dict[str, Any]
    overrides: Overrides
    restore_cache: bool
    #: why the config stays the same (an own command's race class: restart unchanged)
    note: str | None = opt()

    def describe(self) -> str:
        ch = ", ".join(f"{k2}={v}" for k2, v in (self.changed or {}).items())
        return f"fallback for {self.cls}: {self.step or self.note or 'same config'}" + \
            (f" ({ch})" if ch else "")


@dataclass(frozen=True, kw_only=True)
class Restart(EventBase):
    kind: ClassVar[str] = "restart"
    attempt: int               # the attempt that starts next
    delay_s: float
    reason: str

    def describe(self) -> str:
        return f"restart as attempt {self.attempt} in {self.delay_s:.1f}s: {self.reason}"


@dataclass(frozen=True, kw_only=True)
class GiveUp(EventBase):
    kind: ClassVar[str] = "give_up"
    cls: str = req(json="class")
    reason: str
    evidence: list[EvidenceLine]

    def describe(self) -> str:
        return f"giving up on {self.cls}: {self.reason}"


@dataclass(frozen=True, kw_only=True)
class Stopping(EventBase):
    kind: ClassVar[str] = "stopping"
    attempt: int
    reason: str

    def describe(self) -> str:
        return f"stopping: {self.reason}"


@dataclass(frozen=True, kw_only=True)
class Final(EventBase):
    kind: ClassVar[str] = "final"
    status: str                # done | failed | stopped
    reason: str
    last_checkpoint: CheckpointRef | None
    #: the share of the run's wall time spent in training steps, and the time lost per
    #: cause (``orchestrator.common.goodput``)
    goodput: float | None = opt()
    lost_s: dict[str, Any] | None = opt()

    def describe(self) -> str:
        return f"run {self.status}: {self.reason}"


# --- the standby interpreter (supervisor.standby) ------------------------------------------

@dataclass(frozen=True, kw_only=True)
class StandbyStart(EventBase):
    kind: ClassVar[str] = "standby_start"
    attempt: int               # the attempt it is for
    pid: int

    def describe(self) -> str:
        return f"standby interpreter for attempt {self.attempt} started (pid {self.pid})"


@dataclass(frozen=True, kw_only=True)
class StandbyReady(EventBase):
    kind: ClassVar[str] = "standby_ready"
    pid: int
    import_s: float
    modules: int
    niced: bool
    error: str | None

    def describe(self) -> str:
        err = f"; not imported: {self.error}" if self.error else ""
        return f"standby interpreter ready after {float(self.import_s or 0):.1f}s{err}"


@dataclass(frozen=True, kw_only=True)
class StandbyUsed(EventBase):
    kind: ClassVar[str] = "standby_used"
    attempt: int
    pid: int
    import_s: float | None
    age_s: float
    log: str

    def describe(self) -> str:
        return f"attempt {self.attempt} runs in the standby interpreter (pid {self.pid})"


@dataclass(frozen=True, kw_only=True)
class StandbyDiscarded(EventBase):
    kind: ClassVar[str] = "standby_discarded"
    attempt: int | None        # None: discarded when the run ended
    pid: int | None = opt()    # absent: it could not start
    reason: str

    def describe(self) -> str:
        return f"standby interpreter discarded: {self.reason}"

