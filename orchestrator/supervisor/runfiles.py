"""A run directory's files on disk (formats and names: dfo_contract.runstate; the
events' records: dfo_contract.events).

``state.json`` is replaced atomically (dfo_contract.fsio); each ``events.jsonl`` record is
appended with one ``write(2)`` on an ``O_APPEND`` fd, so a reader following by byte offset
never sees half a record followed by another writer's bytes.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dfo_contract import runstate as rs
from dfo_contract.codec import decode, encode
from dfo_contract.errors import ContractError
from dfo_contract.fsio import atomic_write_json, json_safe, read_json
from dfo_contract.runspec import RunSpec
from dfo_contract.runstate import RunState

if TYPE_CHECKING:
    from dfo_contract.events import EventBase

__all__ = ["NotOwner", "Notice", "OWNER_LOCK", "RunDirGone", "check_run_dir", "append_event",
           "notice_paths", "own_run", "read_notice", "read_spec", "read_state",
           "read_state_or_events", "write_json_atomic", "write_notice", "write_state"]

#: held (flock) by the one supervisor that owns the run, for its whole life
OWNER_LOCK = "supervisor.lock"


class NotOwner(RuntimeError):
    """Another live supervisor owns this run directory: write nothing into it."""


class RunDirGone(RuntimeError):
    """The run's directory was deleted while the run was live: nothing of it can be
    recorded there any more."""


def check_run_dir(run_dir: str) -> None:
    """RunDirGone when ``run_dir`` no longer exists (one ``stat``: cheap enough per poll)."""
    if not os.path.isdir(run_dir):
        raise RunDirGone(f"the run directory {run_dir} was deleted while the run was live")


def lock_with_owner(fd: int, owner: str | None, *, wait_s: float = 0.0,
                    retry_s: float = 0.01) -> str | None:
    """An exclusive ``flock`` on ``fd``, tried for up to ``wait_s``: None once held, and the
    file then holds ``owner`` (None: left as it is); else the holder's record (the file's
    content, "" when it has none), with ``fd`` closed. The one lock-and-record step of
    run.lock and supervisor.lock."""
    end = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < end:
                time.sleep(retry_s)
                continue
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            return holder
    if owner is not None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (owner + "\n").encode(), 0)
    return None


def own_run(run_dir: str) -> int:
    """Take the run's ownership: an exclusive ``flock`` on ``<run_dir>/supervisor.lock``,
    kept until the returned fd is closed (the process exits). A supervisor restarted after
    its predecessor died takes it over; a second one while the owner lives gets NotOwner
    and must not write ``state.json`` or ``events.jsonl``. The fd is close-on-exec, so no
    trainer inherits the ownership."""
    path = os.path.join(run_dir, OWNER_LOCK)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        read_only = None
    except OSError as e:   # a read-only run directory: whose it is, then the error
        if e.errno != errno.EROFS:
            raise
        fd, read_only = os.open(path, os.O_RDONLY | os.O_CLOEXEC), e
    holder = lock_with_owner(fd, None if read_only is not None else str(os.getpid()))
    if holder is not None:
        raise NotOwner(f"{run_dir} is owned by another live supervisor"
                       + (f" (pid {holder[:40]})" if holder else "")
                       + "; this one writes nothing there and exits")
    if read_only is not None:
        os.close(fd)
        raise read_only
    return fd


@dataclass(frozen=True)
class Notice:
    """How a run ended that its run directory could not record (it is read-only): left by
    its supervisor where it can write (:func:`notice_paths`), read by ``dfo status`` and
    ``dfo logs -f`` in place of the state.json that still says the run is live. Read and
    written by ``dfo_contract.codec``."""
    run_id: str
    run_dir: str
    #: the supervisor that left it (state.json's ``pid``): a notice counts for that run only
    pid: int
    status: str
    reason: str
    t: float

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    @classmethod
    def from_json(cls, d: Any) -> "Notice":
        """ContractError (a ValueError) when ``d`` is not a notice."""
        return decode(cls, d, what="a notice")


def notice_paths(run_dir: str) -> tuple[str, ...]:
    """Where a run's :class:`Notice` may lie, in the order it is written and read: beside
    the run directory (``runs/.<run-id>.notice.json``), else under ``/tmp`` (another
    filesystem on most hosts), keyed by the run directory's path."""
    run_dir = os.path.abspath(run_dir).rstrip("/")
    parent, name = os.path.split(run_dir)
    key = hashlib.sha256(run_dir.encode()).hexdigest()[:16]
    return (os.path.join(parent, f".{name}.notice.json"),
            os.path.join("/tmp", f"dfo-notices-{os.getuid()}", f"{name}-{key}.json"))


def write_notice(notice: Notice) -> str | None:
    """Leave ``notice`` at the first of its places that takes it; that path (None: none
    could be written)."""
    for path in notice_paths(notice.run_dir):
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            write_json_atomic(path, notice.to_json())
            return path
        except OSError:
            continue
    return None


def read_notice(run_dir: str, pid: Any) -> tuple[Notice, str] | None:
    """The notice the supervisor ``pid`` left for ``run_dir``, and where it lies (None:
    there is none; one of another supervisor of the same directory does not count)."""
    for path in notice_paths(run_dir):
        try:
            with open(path) as f:
                n = Notice.from_json(json.load(f))
        except (OSError, ValueError):
            continue
        if n.run_dir.rstrip("/") == os.path.abspath(run_dir).rstrip("/") and n.pid == pid:
            return n, path
    return None


def write_json_atomic(path: str, obj: Any) -> None:
    """JSON (non-finite floats as strings, sorted keys, indent 1) written atomically."""
    atomic_write_json(path, json_safe(obj), indent=1, sort_keys=True)


def write_state(run_dir: str, state: RunState) -> None:
    write_json_atomic(os.path.join(run_dir, rs.STATE_FILE), state.to_json())


def read_state(run_dir: str) -> RunState:
    """The run's state.json. Raises OSError (absent) or ValueError (not a state)."""
    return RunState.from_json(read_json(os.path.join(run_dir, rs.STATE_FILE)))


def read_state_or_events(run_dir: str) -> tuple[RunState, str | None]:
    """The run's state and, when state.json is damaged (there but not a state), the one line
    that says so: the state is then rebuilt from events.jsonl (``supervisor.policy.runstate_replay``).
    Raises OSError when state.json is absent, ValueError when neither file can tell."""
    try:
        return read_state(run_dir), None
    except ValueError as e:
        damage = f"{rs.STATE_FILE} is damaged ({e})"
    from dfo_contract import events   # only for a damaged state (see append_event)

    from .policy.runstate_replay import state_from_events

    try:
        evs = events.read_events_file(os.path.join(run_dir, rs.EVENTS_FILE))
    except (OSError, ContractError):
        raise ValueError(f"{damage}, and {rs.EVENTS_FILE} cannot be read") from None
    if not evs:
        raise ValueError(f"{damage}, and {rs.EVENTS_FILE} has no events")
    st = state_from_events(os.path.basename(os.path.normpath(run_dir)), evs)
    return st, f"{damage}: rebuilt from {rs.EVENTS_FILE}"


def read_spec(run_dir: str) -> RunSpec:
    """The run's spec.json (``RunSpec.from_json``). Raises OSError (absent) or ContractError
    (not a spec this supervisor reads: one line)."""
    try:
        raw = read_json(os.path.join(run_dir, rs.SPEC_FILE))
    except ValueError as e:
        raise ContractError(f"{rs.SPEC_FILE} is not JSON ({e})") from None
    return RunSpec.from_json(raw)


def append_event(path: str, ev: "EventBase") -> None:
    """Append one event as a single line with a single write (see the module doc)."""
    # imported here: the follower and ``query`` (every ``dfo status``) read state.json
    # through this module and never write an event
    from dfo_contract.events import encode_line

    line = encode_line(ev)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    except OSError as e:    # say which file (a full disk, an I/O error)
        raise OSError(e.errno, e.strerror, path) from e
    finally:
        os.close(fd)
