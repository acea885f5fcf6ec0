"""What is installed vs what the lock says (pure): ``uv pip freeze`` output -> a readable diff.

Lines of the diff::

    torch: lock 2.13.0+cpu, installed 2.12.0
    - numpy: lock 2.4.6, not installed
    + sglang 0.4 (not in lock)
    dfo: expected wheel <root>/wheels/<hash>/dfo-0.1.0-py3-none-any.whl, installed from <url>
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable
from urllib.parse import unquote, urlsplit

from .fingerprint import EXPECT_FIELDS, Mismatch
from ..config.lockfile import Lock, normalize_name


@dataclass(frozen=True)
class Installed:
    name: str  # normalized
    version: str | None = None
    url: str | None = None  # for `name @ url` / editable installs


def parse_freeze(text: str) -> dict[str, Installed]:
    """Parse ``uv pip freeze`` (or ``pip freeze``) output."""
    out: dict[str, Installed] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-e "):
            url = line[3:].strip()
            # "-e file:///src/pkg" or "-e git+...#egg=name"
            name = url.rsplit("#egg=", 1)[1] if "#egg=" in url else url.rstrip("/").rsplit("/", 1)[-1]
            out[normalize_name(name)] = Installed(normalize_name(name), None, url)
        elif " @ " in line:
            name, url = line.split(" @ ", 1)
            n = normalize_name(name.strip())
            out[n] = Installed(n, None, url.strip())
        elif "==" in line:
            name, ver = line.split("==", 1)
            n = normalize_name(name.strip())
            out[n] = Installed(n, ver.strip().split(";")[0].strip())
    return out


@dataclass(frozen=True)
class DriftItem:
    kind: str  # "changed" | "missing" | "extra" | "project" | "fingerprint"
    name: str
    lock: str | None = None
    installed: str | None = None
    text: str = ""

    def __str__(self) -> str:
        return self.text


@dataclass
class Drift:
    items: list[DriftItem] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.items

    @property
    def packages_differ(self) -> bool:
        return any(i.kind in ("changed", "missing", "extra") for i in self.items)

    @property
    def project_differs(self) -> bool:
        return any(i.kind == "project" for i in self.items)

    def lines(self) -> list[str]:
        return [str(i) for i in self.items]

    def summary(self) -> str:
        n = len(self.items)
        head = "; ".join(self.lines()[:3])
        return head + (f"; and {n - 3} more" if n > 3 else "")


def _file_name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def url_path(url: str) -> str:
    """The local path of a ``file://`` URL as uv writes it (percent-encoded: a root
    ``/root/my dfo`` reads ``file:///root/my%20dfo/...``); other URLs unchanged."""
    if url.startswith("file:"):
        return unquote(urlsplit(url).path)
    return url


def diff(lock: Lock, installed: dict[str, Installed], *, project: str | None = "dfo",
         project_wheel: str | None = None, ignore: Iterable[str] = ()) -> Drift:
    """Compare a freeze with a lock. ``project_wheel`` is the remote path of the wheel
    that must be installed as ``project`` (a ``name @ file://...`` line); None: skip."""
    skip = {normalize_name(x) for x in ignore}
    pname = normalize_name(project) if project else None
    items: list[DriftItem] = []
    for name, e in sorted(lock.entries.items()):
        if name in skip:
            continue
        have = installed.get(name)
        if have is None:
            if e.marker:  # conditional requirement (e.g. another platform): may be absent
                continue
            items.append(DriftItem("missing", name, e.version, None,
                                   f"- {name}: lock {e.version}, not installed"))
        elif have.version != e.version:
            got = have.version or have.url or "?"
            items.append(DriftItem("changed", name, e.version, got,
                                   f"{name}: lock {e.version}, installed {got}"))
    for name, have in sorted(installed.items()):
        if name in lock.entries or name in skip or name == pname:
            continue
        got = have.version or have.url or "?"
        items.append(DriftItem("extra", name, None, got, f"+ {name} {got} (not in lock)"))
    if pname and project_wheel is not None:
        have = installed.get(pname)
        if have is None:
            items.append(DriftItem("project", pname, project_wheel, None,
                                   f"{pname}: not installed (expected {project_wheel})"))
        elif not have.url or not url_path(have.url).endswith(project_wheel):
            got = have.url or have.version or "?"
            items.append(DriftItem("project", pname, project_wheel, got,
                                   f"{pname}: expected wheel {project_wheel}, installed {got}"))
    return Drift(items)


def fingerprint_drift(changes: Iterable[Mismatch]) -> list[DriftItem]:
    """Fingerprint fields that changed since deploy, as drift items."""
    out = []
    for m in changes:
        label = EXPECT_FIELDS.get(m.field, m.field)
        out.append(DriftItem("fingerprint", m.field, str(m.expected), str(m.got),
                             f"{label}: recorded {m.expected}, now {m.got}"))
    return out
