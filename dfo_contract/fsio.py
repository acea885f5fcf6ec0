"""File helpers shared by every part: atomic writes, sha256, directory fsync, directory
replacement, JSON-lines files, JSON safety.

A file written with ``atomic_write_*`` is either the old content or the new content,
never a mix: the data goes to a temporary name in the same directory, is fsynced, renamed
over the target, and the directory is fsynced so the rename itself survives a crash.
:func:`replace_dir` does the same for a whole directory. A JSON-lines file
(``metrics.jsonl``) is appended a record per ``write(2)`` (:func:`append_jsonl`) and read
by :func:`read_jsonl`, which skips (and counts) a torn last line or a damaged one.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
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
    except BaseException as e:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.filename is None:   # say which file (a full disk)
            raise OSError(e.errno, e.strerror, p) from e
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


# --- directories --------------------------------------------------------------------------

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _renameat2_exchange(a: str, b: str) -> bool:
    """Atomically swap paths ``a`` and ``b`` (Linux renameat2 RENAME_EXCHANGE). False when
    the call is unavailable here (no symbol, ENOSYS, EINVAL: kernel/filesystem lacks it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err), a, None, b)


def replace_dir(tmp: str | os.PathLike, final: str | os.PathLike, *,
                old: str | os.PathLike | None = None) -> None:
    """Put the complete directory ``tmp`` (a sibling of ``final``) at ``final``, durably.

    Where ``final`` exists, the two are exchanged atomically and the old one (now at ``tmp``)
    deleted, so there is no moment with neither. Without renameat2 the old one is first
    moved aside to ``old`` (default: a hidden sibling of ``final``): a crash in between
    leaves both, never neither."""
    tmp, final = os.fspath(tmp), os.fspath(final)
    if os.path.lexists(final):
        if _renameat2_exchange(tmp, final):
            shutil.rmtree(tmp, ignore_errors=True)  # holds the old one now
        else:
            aside = os.fspath(old) if old is not None else tmp_name(final) + ".old"
            os.replace(final, aside)
            os.replace(tmp, final)
            shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(os.path.dirname(final) or ".")


# --- JSON lines -----------------------------------------------------------------------------

@dataclass
class JsonLines:
    """The JSON objects of a JSON-lines text, in order; ``skipped`` counts the lines that are
    not one (torn by a crash or a concurrent append, invalid bytes, text that is no record). Blank
    lines are neither."""

    records: list[dict] = field(default_factory=list)
    skipped: int = 0


def json_object(line: bytes | str) -> dict | None:
    """The JSON object one line holds, or None (not JSON, torn, invalid bytes, or JSON that
    is not an object)."""
    try:
        rec = json.loads(line)
    except ValueError:  # also UnicodeDecodeError: invalid bytes
        return None
    return rec if isinstance(rec, dict) else None


def parse_jsonl(data: bytes | str) -> JsonLines:
    """Each line of ``data`` that holds a JSON object; the others are skipped and counted."""
    out = JsonLines()
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    for line in raw.splitlines():
        if not line.strip():
            continue
        rec = json_object(line)
        if rec is None:
            out.skipped += 1
        else:
            out.records.append(rec)
    return out


def read_jsonl(path: str | os.PathLike, *, tail_bytes: int | None = None) -> JsonLines:
    """The JSON objects of the file at ``path`` (an OSError where it cannot be read). With
    ``tail_bytes``: only its last that many bytes, without the line they start inside."""
    with open(path, "rb") as f:
        if tail_bytes is None:
            return parse_jsonl(f.read())
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - tail_bytes))
        data = f.read()
    if size > tail_bytes:
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""
    return parse_jsonl(data)


def jsonl_line(rec: Any) -> bytes:
    """One JSON-lines record as the bytes of its line (strict JSON: no NaN or inf)."""
    return (json.dumps(rec, allow_nan=False) + "\n").encode("utf-8")


def append_jsonl(path: str | os.PathLike, rec: Any, *, mode: int = 0o644) -> None:
    """Append ``rec`` as one line with a single ``write(2)`` on an ``O_APPEND`` fd, so a
    concurrent reader sees either nothing of it or all of it, never another record's bytes
    inside it."""
    data = jsonl_line(rec)
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def human_bytes(n: int) -> str:
    """A byte count for people: ``1.5 GiB``, ``212.0 MiB``, ``640 B``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
