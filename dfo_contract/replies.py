"""Replies a remote helper gives the laptop that are not a run's files: typed records read by
``dfo_contract.codec`` (the status replies are ``dfo_contract.status``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .cache_records import FileDigest
from .checkpoints import CkptInfo
from .codec import decode, encode, opt
from .env_fingerprint import EnvFingerprint


@dataclass(frozen=True, kw_only=True)
class LaunchProbeReply:
    """``ops/scripts/launch_probe.sh``'s ``key=value`` lines (also the ``launch`` section of
    launch's facts): ``"1"``/``"0"`` for the init system's ``systemd-run``, ``setsid`` and
    the deployed env's python; run.lock ``free`` or ``held`` and its owner. Keys it does not
    know are kept (``extra``)."""

    systemd: str = "0"
    setsid: str = "0"
    env: str = "0"
    lock: str = "free"
    lock_owner: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        """run.lock is held (by ``lock_owner``, when it names one)."""
        return self.lock == "held"

    @property
    def has_systemd(self) -> bool:
        return self.systemd == "1"

    @property
    def has_env(self) -> bool:
        return self.env == "1"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_lines(cls, output: str) -> "LaunchProbeReply":
        """``key=value`` lines (values may hold ``=``; other lines are skipped)."""
        kv = {}
        for ln in output.splitlines():
            if "=" in ln:
                k, v = ln.split("=", 1)
                kv[k.strip()] = v.strip()
        return decode(cls, kv, what="the launch probe's reply")


@dataclass(frozen=True, kw_only=True)
class RunLockOwner:
    """``locks/run.lock``'s content when it is a JSON object: the holder's run id (``run_id``,
    or ``run``/``id`` as other writers name it) and pid. The supervisor itself writes the
    bare run id (``orchestrator.supervisor.record.RunLock``)."""

    TOLERANT = True

    run_id: str | None = None
    run: str | None = None
    id: str | None = None
    pid: int | None = None

    @property
    def holder(self) -> str | None:
        return self.run_id or self.run or self.id

    @classmethod
    def from_json(cls, obj: Any) -> "RunLockOwner":
        return decode(cls, obj, what="run.lock")


@dataclass(frozen=True, kw_only=True)
class RunStep:
    """A launch step that runs ``run`` (an argv, never a shell line) for at most ``timeout``
    seconds; its output is kept for the reply."""

    id: str
    run: list[str]
    timeout: float = 60.0


@dataclass(frozen=True, kw_only=True)
class WriteStep:
    """A launch step that writes ``data`` (base64) to the path ``write`` atomically (a
    temporary name beside it, fsync, rename) with ``mode``; an ``optional`` one that fails
    is passed over."""

    id: str
    write: str
    data: str
    mode: int = 0o644
    optional: bool = False


@dataclass(frozen=True, kw_only=True)
class StepsRequest:
    """What ``orchestrator.remote.run_steps`` reads on stdin: the steps, run in order (a step
    is read as the record whose fields it has: ``run`` or ``write``)."""

    steps: list[RunStep | WriteStep] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "StepsRequest":
        return decode(cls, obj, what="the launch request")


@dataclass(frozen=True, kw_only=True)
class StepsReply:
    """``orchestrator.remote.run_steps``' answer (its ``@dfo-steps`` line): ``{"done": N}``,
    or ``{"failed": ID, "exit_code", "stdout", "stderr"}`` where ID is the failed step's id
    (null: the steps could not be read or run at all)."""

    done: int | None = None
    failed: str | int | None = None
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""

    @property
    def is_failure(self) -> bool:
        """A step failed (every failure carries its exit code; a success never does)."""
        return self.exit_code is not None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "StepsReply":
        return decode(cls, obj, what="the launch steps' reply")


@dataclass(frozen=True, kw_only=True)
class TensorBoardReply:
    """A line of ``orchestrator.remote.tensorboard_serve``: ``{"port", "pid"}`` once it
    answers, ``{"error", "detail"}`` when it cannot start, ``{"exit", "detail"}`` when it
    ended."""

    port: int | None = None
    pid: int | None = None
    error: str | None = None
    exit: int | None = None
    detail: str = ""

    @classmethod
    def from_json(cls, obj: Any) -> "TensorBoardReply":
        return decode(cls, obj, what="tensorboard's reply", tolerant=True)


@dataclass(frozen=True, kw_only=True)
class LeaseHolder:
    """Who holds the deploy lease (``locks/deploy.owner``: ``TOKEN`` then this record's
    JSON): the user, machine, pid and the process's start time (``procs.process_start``)
    of the deploy, and when it started; ``info``: the owner line's text when it was not
    such a record (an older dfo's)."""

    user: str | None = None
    machine: str | None = None
    pid: int | None = None
    pid_start: int | None = None
    started: str | None = None
    info: str | None = opt()

    def to_text(self) -> str:
        return json.dumps(encode(self), separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> "LeaseHolder":
        """The record, or ``LeaseHolder(info=text)`` when ``text`` is not one."""
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, TypeError):
            obj = None
        if not isinstance(obj, dict):
            return cls(info=text)
        return decode(cls, obj, what="the deploy lease's owner", tolerant=True)


@dataclass(frozen=True, kw_only=True)
class PortRecord:
    """One ``@dfo-port`` line of ``orchestrator/remote/port_probe.py`` (a group's
    head-reachability probe): ``event`` ``bind`` / ``listening`` / ``accepted`` /
    ``stopped`` / ``done`` (the head's listener) or ``connect`` (a member's attempt), with
    the port, whether it worked and the error (``errno``: its name) when it did not."""

    event: str
    port: int | None = None
    ok: bool | None = None
    error: str | None = None
    errno: str | None = None
    ports: list[int] = field(default_factory=list)
    peer: str | None = None
    hello: str | None = None

    @classmethod
    def from_json(cls, obj: Any) -> "PortRecord":
        return decode(cls, obj, what="a port probe record", tolerant=True)


@dataclass(frozen=True, kw_only=True)
class WarmupShape:
    """One compiled shape of the trainer's warm-up report (``python -m trainer warmup
    --report``; the trainer's ``WarmupRecord``): the device, the shape, what was compiled,
    its seconds and the compile counters (``fxgraph_cache_hit``, ...)."""

    device: str = "?"
    shape: list[int] = field(default_factory=list)
    what: str = ""
    seconds: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)

    TOLERANT = True


@dataclass(frozen=True, kw_only=True)
class WarmupReport:
    """The trainer's warm-up report (``python -m trainer warmup --report FILE``): each
    compiled shape, the process's compile-counter totals and the whole warm-up's seconds
    (model building included). The trainer writes more (phases, bypass reasons, ...);
    those keys are kept in ``extra``. A shape's mistyped field reads as its default."""

    records: list[WarmupShape]
    totals: dict[str, int] | None = None
    seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: Any) -> "WarmupReport":
        return decode(cls, obj, what="the trainer's warm-up report")


@dataclass(frozen=True, kw_only=True)
class ExportReply:
    """``python -m trainer export``'s last line: the export's directory on the host, the
    checkpoint's step and accept length, the target's precision in training (``fp8`` or
    ``full``) and the sha256 and size of every file written (``dfo_export.json`` aside)."""

    kind: str = "export"
    out: str
    step: int
    accept_len: float | None = None
    target_precision: str = "full"
    files: dict[str, FileDigest]

    @classmethod
    def from_json(cls, obj: Any) -> "ExportReply":
        return decode(cls, obj, what="the export's reply")


@dataclass(frozen=True, kw_only=True)
class CheckpointListing:
    """``python -m dfo_contract.checkpoints list DIR --json``: the directory listed (with
    ``--run``: the one holding that run's checkpoints, None when none does), the newest
    valid checkpoint's name, every checkpoint, and with ``--run`` the runs whose checkpoints
    DIR holds."""

    dir: str | None = None
    latest: str | None = None
    checkpoints: list[CkptInfo] = field(default_factory=list)
    runs_in_dir: list[str] = opt(factory=list)

    def oldest_first(self) -> list[CkptInfo]:
        """The checkpoints by step, oldest first."""
        return sorted(self.checkpoints, key=lambda c: c.step)

    @classmethod
    def from_json(cls, obj: Any) -> "CheckpointListing":
        return decode(cls, obj, what="the checkpoint listing")


@dataclass(frozen=True, kw_only=True)
class BestCheckpoint:
    """``<checkpoints>/best``, written by the trainer after an evaluation that beat every
    earlier one: that checkpoint's step, its name and its accept length."""

    step: int
    name: str = ""
    accept_len: float | None = None

    @classmethod
    def from_json(cls, obj: Any) -> "BestCheckpoint":
        return decode(cls, obj, what="the best checkpoint's record")


@dataclass(frozen=True, kw_only=True)
class PartError:
    """A part of a helper's answer that failed, in its place: ``{"error": why}``."""

    error: str


@dataclass(frozen=True, kw_only=True)
class EnvFacts:
    """``orchestrator.remote.launch_facts``' ``@dfo-facts`` line: what ``dfo launch`` asks
    the deployed env's python in its one round trip. Each part is asked for or absent
    (None); a part that failed is a :class:`PartError` in its place, the others still
    answer: the env's ``fingerprint.json``, the trainer source's ``{path: sha256}``, the
    files hashed (``{file: sha256 or null}``), the checkpoints of each dir by manifest, your
    own trainer's resume glob matches (``[path, mtime]``) and the live compile caches."""

    #: a fingerprint.json that does not read as one stays its raw object (the launch
    #: counts it as absent)
    fingerprint: PartError | EnvFingerprint | dict[str, Any] | None = None
    source: PartError | dict[str, str] | None = None
    hashes: dict[str, PartError | str | None] = field(default_factory=dict)
    checkpoints: dict[str, PartError | list[CkptInfo]] = field(default_factory=dict)
    glob: PartError | list[tuple[str, float]] | None = None
    caches: PartError | list[str] | None = None

    @classmethod
    def from_json(cls, obj: Any) -> "EnvFacts":
        return decode(cls, obj, what="the env's launch facts")
