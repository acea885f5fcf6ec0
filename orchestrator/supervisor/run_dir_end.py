"""The end of a run whose directory became unusable under it: deleted, on a read-only
filesystem, full (ENOSPC), over its quota (EDQUOT), or failing (EIO). Nothing more can be
recorded there, so the run ends once, says why where it can still be read, and exits with
``RUN_DIR_UNUSABLE_EXIT`` (never restarted: a supervisor that came back by itself once space
is freed would race the run a user relaunched)."""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable

from dfo_contract.runstate import RunState

from ..common.launch_argv import RUN_DIR_UNUSABLE_EXIT
from . import procs, runfiles


@dataclass(frozen=True)
class Ending:
    """The run that ends: its id and directory, where its checkpoints are (None: as the
    trainer's ``checkpoint.dir`` says) and how long its processes get after SIGTERM."""
    run_id: str
    run_dir: str
    checkpoints: str | None
    kill_grace_s: float

    @property
    def checkpoints_shown(self) -> str:
        return self.checkpoints or "checkpoint.dir"


def kill_run(run_dir: str, sig: int, kill_grace_s: float) -> list[int]:
    """Every process of the run (found by DFO_RUN_DIR) gets ``sig``, SIGKILL after
    ``kill_grace_s`` when it was not that; the pids found."""
    left = procs.processes_of_run(run_dir)
    if left:
        procs.signal_all(left, sig)
        if not procs.wait_gone(left, kill_grace_s if sig != signal.SIGKILL else 5):
            procs.signal_all(left, signal.SIGKILL)
            procs.wait_gone(left, 5)
    return left


def gone(run: Ending) -> int:
    """The run's directory was deleted under the live run: stop what runs for it, say so
    where it can still be read (stderr: the journal under systemd; the system log)."""
    left = kill_run(run.run_dir, signal.SIGKILL, run.kill_grace_s)
    say(f"dfo-supervisor: run {run.run_id}: the run directory {run.run_dir} was deleted "
        f"while the run was live; the run ends (its trainer was killed; {len(left)} "
        f"process(es)); its checkpoints in {run.checkpoints_shown} are kept")
    return RUN_DIR_UNUSABLE_EXIT


#: the errors of a write that end the run, with what they say of the directory (or of the
#: file outside it) and the repair
UNWRITABLE = {
    errno.EROFS: ("is read-only", "is on a read-only filesystem",
                  "make it writable (remount it read-write)"),
    errno.ENOSPC: ("is on a full filesystem", "is on a full filesystem",
                   "free space there (df -h shows it; the checkpoints share this disk by "
                   "default)"),
    errno.EDQUOT: ("is over its disk quota", "is over its disk quota",
                   "free space or raise the quota"),
    errno.EIO: ("cannot be written (an I/O error: a failing disk or a lost network "
                "filesystem)", "cannot be written (an I/O error)",
                "check the disk (dmesg) or the mount"),
}


def unwritable(run: Ending, e: OSError, state: RunState, release: Callable[[], None]) -> int:
    """A write of the supervisor's failed for good (``UNWRITABLE``: read-only, full, over
    quota, I/O error): state.json and events.jsonl cannot say anything more, so the run
    ends here, once, instead of a supervisor that fails and is restarted until the
    directory is writable again. The trainer is stopped (SIGTERM: it may still save a
    checkpoint elsewhere), run.lock is given back (``release``), and the reason is left
    where ``dfo status`` and ``dfo logs -f`` read it (a :class:`runfiles.Notice`), on
    stderr and in the system log."""
    left = kill_run(run.run_dir, signal.SIGTERM, run.kill_grace_s)
    release()
    rd = run.run_dir
    where = os.path.abspath(e.filename) if isinstance(e.filename, str) else rd
    inside = where == rd or where.startswith(rd + os.sep)
    code = e.errno if e.errno in UNWRITABLE else errno.EIO
    of_dir, of_file, cure = UNWRITABLE[code]
    what = f"the run directory {rd} {of_dir}" if inside else f"{where} {of_file}"
    if state.final:    # it ended; only its final word could not be written
        status = str(state.status)
        reason = f"{state.reason} ({what}: state.json could not record the end)"
    else:
        status = "failed"
        reason = (f"{what} ({errno.errorcode[code]} writing {where}): the supervisor "
                  f"cannot record the run, so the run ends (its trainer was stopped; "
                  f"{len(left)} process(es)); its checkpoints in {run.checkpoints_shown} are "
                  f"kept; {cure}, then dfo launch --resume latest")
    path = runfiles.write_notice(runfiles.Notice(
        run_id=run.run_id, run_dir=rd, pid=recorded_pid(rd, state), status=status,
        reason=reason, t=time.time()))
    say(f"dfo-supervisor: run {run.run_id}: {reason}"
        + (f" (recorded in {path})" if path else ""))
    return RUN_DIR_UNUSABLE_EXIT


def recorded_pid(run_dir: str, state: RunState) -> int:
    """The supervisor pid state.json names (this one's once it saved; its dead
    predecessor's when this one could not even start on the directory)."""
    if state.pid:
        return int(state.pid)
    try:
        return int(runfiles.read_state_or_events(run_dir)[0].pid or os.getpid())
    except (OSError, ValueError):
        return os.getpid()


def say(line: str) -> None:
    """One line where a run that cannot write its own files is still heard: stderr (the
    journal under systemd) and the system log."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
    try:
        import syslog

        syslog.openlog("dfo-supervisor")
        syslog.syslog(syslog.LOG_ERR, line)
    except OSError:
        pass
