"""A checkpoint that does not fit: the filesystem is full (ENOSPC) or over quota (EDQUOT).

No restart can help until space is freed, so the trainer ends with its own exit code
(``dfo_contract.exitcodes.DISK_FULL``) and one line that says which filesystem, how much is
free there and how much the checkpoint needs, after removing what it had written of it.
Torch-free.
"""

from __future__ import annotations

import errno
import os

from dfo_contract import checkpoints as cm
from dfo_contract.exitcodes import DiskFullError
from dfo_contract.fsio import human_bytes

_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(exc: BaseException) -> bool:
    """An OSError of a full filesystem or an exceeded quota (also when torch or safetensors
    wrapped it: the message keeps the errno's text)."""
    if isinstance(exc, OSError) and exc.errno in _ERRNOS:
        return True
    text = str(exc)
    return any(os.strerror(e) in text for e in _ERRNOS)


class _Writes:
    """A file torch.save writes through, keeping the OSError a write met: torch reports a
    failed write as a RuntimeError that no longer says why (``unexpected pos ...``)."""

    def __init__(self, f):
        self.f = f
        self.error: OSError | None = None

    def write(self, b) -> int:
        try:
            return self.f.write(b)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        try:
            self.f.flush()
        except OSError as e:
            self.error = e
            raise


def torch_save(obj, path: str) -> None:
    """``torch.save(obj, path)``, raising the OSError (ENOSPC, EDQUOT, EIO) a write met."""
    import torch

    with open(path, "wb") as f:
        w = _Writes(f)
        try:
            torch.save(obj, w)
        except RuntimeError:
            if w.error is not None:
                raise w.error from None
            raise


def mount_of(path: str) -> str:
    """The mount point of the filesystem ``path`` lives on."""
    p = os.path.realpath(path)
    while not os.path.ismount(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def tree_bytes(path: str) -> int:
    """Bytes of the regular files under ``path`` (0 when it is gone)."""
    n = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                n += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return n


def need_bytes(root: str, partial_bytes: int) -> tuple[int, bool]:
    """What one checkpoint needs: the newest complete one's size under ``root`` (exact: the
    same model and optimizer), else what the failed save had written (a lower bound)."""
    for c in reversed(cm.list_checkpoints(root, check_hashes=False)):
        if c.valid:
            size = tree_bytes(c.path)
            if size:
                return size, True
    return partial_bytes, False


def error(root: str, step: int, partial: str, exc: BaseException) -> DiskFullError:
    """The one-line error for a save of ``step`` into ``root`` that ran out of space, after
    removing the save's partial directory ``partial`` and the temp dirs of dead writers
    (an earlier attempt killed mid-save) that hold no checkpoint's only copy."""
    import shutil

    written = tree_bytes(partial)
    shutil.rmtree(partial, ignore_errors=True)
    for stale in cm.stale_tmp_dirs(root):
        shutil.rmtree(stale, ignore_errors=True)
    need, exact = need_bytes(root, written)
    mount = mount_of(root)
    try:
        st = os.statvfs(root)
        free = human_bytes(st.f_bavail * st.f_frsize)
    except OSError:
        free = "unknown"
    what = "over quota" if isinstance(exc, OSError) and exc.errno == errno.EDQUOT else "full"
    needs = (human_bytes(need) if exact else f"more than {human_bytes(need)}" if need else
             f"more than the {free} free")
    return DiskFullError(
        f"disk full: the filesystem at {mount} is {what} ({free} free); checkpoint step_{step} "
        f"in {root} needs {needs}",
        hint="free space there or set checkpoint.dir to a larger filesystem, then resume; "
             "the complete checkpoints are kept and the partial ones were removed")
