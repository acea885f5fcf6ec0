"""Stack dumps of a hung attempt, kept in the run's ``stacks/`` before it is killed."""

from __future__ import annotations

import os
import signal
import time

from dfo_contract import runstate as rs
from dfo_contract.fsio import atomic_write_text

from . import procs

#: how long the trainer's faulthandler gets to print its stacks after SIGUSR1
FAULTHANDLER_WAIT_S = 1.5


def dump_stacks(run_dir: str, n: int, pid: int, log_path: str, python: str) -> list[str]:
    """Keep the hung attempt's stacks in stacks/: py-spy if present, else the trainer's
    faulthandler (SIGUSR1, printed into the attempt log), plus each thread's kernel wait
    channel. Returns the files written, relative to ``run_dir``."""
    d = os.path.join(run_dir, rs.STACKS_DIR)
    os.makedirs(d, exist_ok=True)
    files = []
    pids = procs.descendants(pid) or [pid]
    spy = procs.py_spy([os.path.dirname(python)])
    for p in pids:
        name = f"attempt-{n}-pid-{p}"
        text = procs.py_spy_dump(spy, p) if spy else None
        how = "py-spy"
        if not text and procs.catches(p, signal.SIGUSR1):
            before = os.path.getsize(log_path)
            os.kill(p, signal.SIGUSR1)
            time.sleep(FAULTHANDLER_WAIT_S)
            with open(log_path, "rb") as f:
                f.seek(before)
                text = f.read().decode("utf-8", "replace")
            how = "faulthandler"
        k = procs.kernel_stacks(p)
        body = f"# {how if text else 'no python stacks (no py-spy, no SIGUSR1 handler)'}; " \
               f"pid {p}: {' '.join(procs.cmdline(p))[:300]}\n{text or ''}\n# kernel\n{k}"
        atomic_write_text(os.path.join(d, name + ".txt"), body)
        files.append(os.path.join(rs.STACKS_DIR, name + ".txt"))
    return files
