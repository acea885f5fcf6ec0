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

#: an ELF file is at least its 64-byte header (ELF64)
ELF_MAGIC = b"\x7fELF"
ELF_HEADER = 64
#: a kept file whose name ends so is loaded as code
SHARED = (".so",)


#: files that are empty by design: the lock files torch and triton take (filelock)
EMPTY_OK = (".lock",)


def bad_artifact(name: str, size: int, head: bytes) -> str | None:
    """Why a cache file cannot be kept (None: keep it): empty (a lock file excepted: it is
    empty by design), or a shared object that is not a whole ELF file."""
    if size == 0:
        return None if name.endswith(EMPTY_OK) else "empty"
    if name.endswith(SHARED):
        if not head.startswith(ELF_MAGIC):
            return "not an ELF shared object"
        if size < ELF_HEADER:
            return f"a shared object of {size} bytes (cut short)"
    return None


_IMPORT = re.compile(r"ImportError: (?P<path>/\S+?\.so)\b:?\s*(?P<why>.*)$")


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
