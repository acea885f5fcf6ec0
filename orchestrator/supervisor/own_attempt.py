"""Your own trainer's attempt (``dfo launch -- CMD ARGS...``): its argv, env, directory,
the checkpoint to resume and the ladder's ``run_first`` commands. Decisions are in
``common.own_trainer``; this module only looks at files and runs the commands."""

from __future__ import annotations

import glob
import os
import subprocess
import time
from typing import Mapping

from dfo_contract.runspec import Own

from ..common import own_trainer


def cwd(own: Own, run_dir: str) -> str:
    return own.cwd or run_dir


def env(own: Own, python: str, changes: own_trainer.Changes, base: Mapping[str, str]) -> dict:
    """The deployed env's bin (``python``'s) first on PATH, the run file's env, then the
    ladder's."""
    e = dict(base)
    bindir = os.path.dirname(python)
    e["PATH"] = bindir + os.pathsep + e.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    e["VIRTUAL_ENV"] = os.path.dirname(bindir)
    e.update(own.env)
    e.update(changes.env)
    return e


def resume_target(own: Own, run_dir: str, since: float = 0.0) -> str | None:
    """The newest checkpoint the run file's glob finds (relative to the command's dir)
    that this run wrote (modified at or after ``since``, the run's start): an earlier
    run's checkpoints are taken only through ``--resume``."""
    r = own.resume
    if r is None:
        return None
    base = cwd(own, run_dir)
    pattern = r.glob if r.glob.startswith("/") else os.path.join(base, r.glob)
    found = []
    for p in glob.glob(pattern):
        try:
            mtime = os.stat(p).st_mtime
        except OSError:
            continue
        if mtime >= since:
            found.append((p, mtime))
    return own_trainer.newest_checkpoint(found, r.order)


def argv(own: Own, changes: own_trainer.Changes, resume: str | None) -> list[str]:
    return own_trainer.attempt_argv(own.command, changes, resume_path=resume,
                            resume_args=own.resume.args if own.resume else ())


def run_first(cmds: list[list[str]], env_: Mapping[str, str], cwd_: str, log_path: str,
              timeout: float) -> tuple[bool, str]:
    """Run the ladder's ``run_first`` commands in order, output into the attempt log.
    (False, why) at the first that fails."""
    for cmd in cmds:
        with open(log_path, "ab") as logf:
            logf.write(f"dfo: running first: {cmd!r}\n".encode())
            logf.flush()
            t0 = time.monotonic()
            try:
                p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                   env=dict(env_), cwd=cwd_, timeout=timeout)
            except (OSError, subprocess.TimeoutExpired) as e:
                return False, f"{cmd[0]}: {e}"
            logf.write(f"dfo: {cmd[0]} exited {p.returncode} after "
                       f"{time.monotonic() - t0:.1f}s\n".encode())
        if p.returncode != 0:
            return False, f"{' '.join(cmd)} exited {p.returncode}"
    return True, ""
