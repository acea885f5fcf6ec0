"""known_hosts: look up, check and record SSH host keys (OpenSSH's file format).

dfo never auto-adds a key (no paramiko ``AutoAddPolicy``). A key is recorded only by
``dfo hosts trust NAME`` after the user saw its fingerprint. Hashed entries (``|1|...``)
are understood. Writes go to a temporary file that is renamed over the original, so a
crash never leaves a half-written known_hosts.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from hashlib import sha1
from base64 import b64decode

import paramiko
from dfo_contract.fsio import atomic_write_bytes

from ..common.errors import ConfigError

KNOWN = "known"
UNKNOWN = "unknown"
CHANGED = "changed"


def host_key_name(host: str, port: int) -> str:
    """How known_hosts names a host: ``host`` on port 22, else ``[host]:port``."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...`` as ``ssh-keygen -lf`` prints it."""
    return key.fingerprint


def describe_key(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {fingerprint(key)}"


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        try:
            _, _, salt_b64, hash_b64 = pattern.split("|")
            salt = b64decode(salt_b64)
            want = b64decode(hash_b64)
        except (ValueError, TypeError):
            return False
        return hmac.compare_digest(hmac.new(salt, name.encode(), sha1).digest(), want)
    return pattern == name


@dataclass(frozen=True)
class Entry:
    lineno: int
    names: tuple[str, ...]
    key: paramiko.PKey

    def matches(self, name: str) -> bool:
        return any(_matches(p, name) for p in self.names)


def read_entries(path: str) -> list[Entry]:
    """Parseable entries of a known_hosts file (comments, markers and junk are skipped)."""
    if not os.path.exists(path):
        return []
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith(("#", "@")):
                    continue
                try:
                    e = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
                except (paramiko.SSHException, ValueError, TypeError):
                    continue
                except Exception:  # noqa: BLE001 - unsupported key types raise assorted errors
                    continue
                if e is not None and e.key is not None:
                    out.append(Entry(lineno, tuple(e.hostnames), e.key))
    except OSError as err:
        raise ConfigError(f"cannot read known_hosts file {path}: {err.strerror}") from None
    return out


def lookup(path: str, name: str) -> list[paramiko.PKey]:
    """Keys recorded for ``name`` (``host`` or ``[host]:port``)."""
    return [e.key for e in read_entries(path) if e.matches(name)]


def status(path: str, name: str, key: paramiko.PKey) -> str:
    """KNOWN (this exact key is recorded), UNKNOWN (no key for the host) or
    CHANGED (the host has recorded keys and this is none of them)."""
    keys = lookup(path, name)
    if not keys:
        return UNKNOWN
    if any(k.get_name() == key.get_name() and k.asbytes() == key.asbytes() for k in keys):
        return KNOWN
    return CHANGED


def add(path: str, name: str, key: paramiko.PKey, *, replace: bool = False) -> None:
    """Record ``key`` for ``name``. With ``replace``, first drop every line that names the
    host (only that host's name is removed from lines naming several hosts)."""
    path = os.path.expanduser(path)
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
    old_lines: list[str] = []
    mode = 0o600
    if os.path.exists(path):
        mode = os.stat(path).st_mode & 0o7777
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            old_lines = f.read().splitlines(keepends=True)
    if old_lines and not old_lines[-1].endswith("\n"):
        old_lines[-1] += "\n"
    lines = []
    for line in old_lines:
        kept = _without_name(line, name) if replace else line
        if kept is not None:
            lines.append(kept)
    lines.append(f"{name} {key.get_name()} {key.get_base64()}\n")
    atomic_write_bytes(path, "".join(lines).encode("utf-8", "surrogateescape"), mode=mode)


def _without_name(line: str, name: str) -> str | None:
    """The line with ``name`` removed from its host list; None when nothing is left."""
    stripped = line.strip()
    if not stripped or stripped.startswith(("#", "@")):
        return line
    parts = stripped.split(None, 1)
    if len(parts) < 2:
        return line
    names = parts[0].split(",")
    keep = [n for n in names if not _matches(n, name)]
    if len(keep) == len(names):
        return line
    if not keep:
        return None
    return ",".join(keep) + " " + parts[1] + "\n"
