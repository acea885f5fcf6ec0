"""Process helpers shared by every part."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (ours or another user's).

    ``pid <= 0`` is never alive: ``os.kill(0 or -1, 0)`` would ask about a whole
    process group, not one process.
    """
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
