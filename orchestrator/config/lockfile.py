"""Parse a hash-pinned lock made by ``uv pip compile --generate-hashes`` (pure).

A lock is a requirements file where every requirement is ``name==version`` followed
by one or more ``--hash=sha256:<hex>`` options (continued with ``\\``), and comments.
The lock hash, the identity of an environment, is the sha256 of the file's bytes
(``HostTree.env_dir`` uses its first 12 hex digits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dfo_contract.fsio import sha256_bytes

from ..common.errors import ConfigError

_REQ = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*(?P<version>[^\s;\\]+)"
    r"\s*(?:;\s*(?P<marker>[^\\]*?))?\s*$"
)
_HASH = re.compile(r"^--hash=(?P<algo>sha256):(?P<hex>[0-9a-fA-F]{64})$")


class LockError(ConfigError):
    """A lock file that is not a valid hash-pinned lock."""


def normalize_name(name: str) -> str:
    """PEP 503 normalized project name: ``Typing_Extensions`` -> ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class LockEntry:
    name: str  # normalized
    version: str
    hashes: tuple[str, ...]  # "sha256:<hex>"
    marker: str | None = None
    line: int = 0


@dataclass(frozen=True)
class Lock:
    entries: dict[str, LockEntry]
    sha256: str
    options: tuple[str, ...] = field(default_factory=tuple)  # e.g. "--index-url ..." lines

    @property
    def short_hash(self) -> str:
        return self.sha256[:12]

    def version(self, name: str) -> str | None:
        e = self.entries.get(normalize_name(name))
        return e.version if e else None


def lock_hash(data: bytes) -> str:
    return sha256_bytes(data)


def _logical_lines(text: str):
    """Join ``\\`` continuations; strip comments. Yields (first_line_no, text)."""
    buf: list[str] = []
    start = 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0] if not raw.lstrip().startswith("#") else ""
        line = line.strip()
        if not buf:
            start = no
        if line.endswith("\\"):
            buf.append(line[:-1].strip())
            continue
        buf.append(line)
        joined = " ".join(p for p in buf if p)
        buf = []
        if joined:
            yield start, joined
    if buf:
        joined = " ".join(p for p in buf if p)
        if joined:
            yield start, joined


def parse_lock(data: bytes | str, *, source: str = "lock") -> Lock:
    """Parse lock text. Raises LockError (one line, with the line number) when a
    requirement is not pinned with ``==`` or carries no sha256 hash."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LockError(f"{source}: not UTF-8 text ({e.reason})",
                        hint="regenerate it with tools/make_lock.py") from None
    entries: dict[str, LockEntry] = {}
    options: list[str] = []
    for no, line in _logical_lines(text):
        if line.startswith("-"):
            options.append(line)
            continue
        parts = line.split()
        # the requirement is everything before the first --hash option
        req_parts = [p for p in parts if not p.startswith("--hash")]
        hash_parts = [p for p in parts if p.startswith("--hash")]
        other_opts = [p for p in req_parts if p.startswith("--")]
        if other_opts:
            raise LockError(f"{source}:{no}: unsupported per-requirement option {other_opts[0]}",
                            hint="a lock holds only `name==version --hash=sha256:...`")
        req = " ".join(req_parts)
        m = _REQ.match(req)
        if not m:
            raise LockError(f"{source}:{no}: `{req}` is not pinned as name==version",
                            hint="every requirement in a lock must be exact; regenerate it "
                                 "with tools/make_lock.py")
        hashes = []
        for h in hash_parts:
            hm = _HASH.match(h)
            if not hm:
                raise LockError(f"{source}:{no}: bad hash option `{h}`",
                                hint="expected --hash=sha256:<64 hex digits>")
            hashes.append(f"sha256:{hm['hex'].lower()}")
        name = normalize_name(m["name"])
        if not hashes:
            raise LockError(f"{source}:{no}: {name}=={m['version']} has no --hash",
                            hint="generate the lock with `uv pip compile --generate-hashes` "
                                 "(tools/make_lock.py)")
        if name in entries:
            raise LockError(f"{source}:{no}: {name} is pinned twice "
                            f"(also on line {entries[name].line})",
                            hint="regenerate the lock with tools/make_lock.py")
        entries[name] = LockEntry(name=name, version=m["version"], hashes=tuple(hashes),
                                  marker=(m["marker"] or None), line=no)
    if not entries:
        raise LockError(f"{source}: holds no requirements",
                        hint="regenerate it with tools/make_lock.py")
    return Lock(entries=entries, sha256=lock_hash(raw), options=tuple(options))
