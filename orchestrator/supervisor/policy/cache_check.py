"""What in a run's compile cache a restart must not keep. Pure: the supervisor walks the
cache and deletes (``supervisor.cache_scrub``); these functions judge names, sizes and the
first bytes, and an attempt's output.

torch and triton do not write every cache entry by rename: an attempt killed (``kill -9``,
the OOM killer, a watchdog) while it compiled can leave an inductor ``.so`` or a code file
of 0 bytes, or a shared object cut short, where the next attempt loads it and fails at
start-up (``ImportError: .../main.so: file too short``).
"""

from __future__ import annotations

import re
from typing import Iterable

#: the judgement of one file is the cache helper's (it runs on hosts without dfo too)
from ...remote.cache_tool import ELF_HEADER, ELF_MAGIC, SHARED, bad_artifact  # noqa: F401

_IMPORT = re.compile(r"ImportError: (?P<path>/\S+?\.so)\b:?\s*(?P<why>.*)$")


def import_error_path(line: str) -> str | None:
    """The shared object a :func:`cache_import_error` line names."""
    m = _IMPORT.search(line)
    return m.group("path") if m else None


def cache_import_error(lines: Iterable[str], cache_dir: str) -> str | None:
    """The line of an attempt's output saying a shared object from ``cache_dir`` could not
    be loaded (``ImportError: CACHE/.../main.so: file too short``, invalid ELF header,
    undefined symbol, ...), or None."""
    root = cache_dir.rstrip("/") + "/"
    for ln in lines:
        m = _IMPORT.search(ln)
        if m and m.group("path").startswith(root):
            return ln.strip()
    return None
