"""File helpers shared by every part: atomic writes, sha256, directory fsync, JSON safety.

A file written with ``atomic_write_*`` is either the old content or the new content,
never a mix: the data goes to a temporary name in the same directory, is fsynced, renamed
over the target, and the directory is fsynced so the rename itself survives a crash.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Mapping

_BUF = 1 << 20


def sha256_file(path: str | os.PathLike, bufsize: int = _BUF) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory so renames inside it are durable (best effort where unsupported)."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def tmp_name(path: str | os.PathLike) -> str:
    """The temporary sibling used while ``path`` is being written (hidden, per process)."""
    p = os.fspath(path)
    d, base = os.path.split(p)
    return os.path.join(d, f".{base}.tmp-{os.getpid()}")


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename, fsync dir)."""
    p = os.fspath(path)
    tmp = tmp_name(p)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(fd)
    try:
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(p) or ".")


def atomic_write_text(path: str | os.PathLike, text: str, *, mode: int = 0o644) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def json_safe(obj: Any) -> Any:
    """JSON-safe: non-finite floats become strings (``"nan"``, ``"inf"``), tuples lists,
    mapping keys strings, so what is written stays strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 1,
                      sort_keys: bool = True, mode: int = 0o644) -> None:
    """JSON (strict: no NaN/inf) plus a final newline, written atomically."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=False) + "\n"
    atomic_write_text(path, text, mode=mode)


def read_json(path: str | os.PathLike) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())
