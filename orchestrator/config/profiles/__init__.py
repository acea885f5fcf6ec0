"""Environment profiles: a hash-pinned lock plus what a probe of the env must show.

Each profile is a directory holding ``profile.yaml`` and its lock (``requirements.lock``,
made by ``tools/make_lock.py`` from ``requirements.in``). The profiles shipped with dfo
live beside this file; hosts.yaml may also name a profile directory by path.

``profile.yaml``::

    name: cpu
    description: ...
    python: "3.11"                  # the interpreter the venv is made from
    platform: x86_64-manylinux_2_28 # what the lock was compiled for
    lock: requirements.lock
    lock_sha256: <hex>              # written by tools/make_lock.py
    sources: {index_url: ..., extra_index_urls: [...], find_links: [...], index_strategy: ...}
    min_free_mb: 2500               # refuse to build an env with less free disk
    expect: {torch: 2.13.0+cpu, torch_cuda: null, ...}   # see plan/fingerprint.py
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...common.errors import ConfigError
from ..lockfile import Lock, lock_hash, parse_lock

PROFILES_DIR = Path(__file__).resolve().parent

#: fingerprint field -> the name a person knows (used in mismatch messages)
EXPECT_FIELDS: dict[str, str] = {
    "python": "python",
    "torch": "torch.__version__",
    "torch_git": "torch.version.git_version",
    "torch_cuda": "torch.version.cuda",
    "triton": "triton.__version__",
    "cuda_available": "torch.cuda.is_available()",
    "device_count": "torch.cuda.device_count()",
    "device_names": "torch.cuda.get_device_name()",
    "device_capability": "torch.cuda.get_device_capability()",
    "transformers": "transformers.__version__",
    "trainer_import": "import trainer",
    "dfo": "dfo version",
    "gpu_smoke": "flex_attention compile (forward+backward) on cuda:0",
}


_SOURCE_KEYS = ("index_url", "extra_index_urls", "find_links", "index_strategy", "env_find_links",
                "unserved_hint")


@dataclass(frozen=True)
class Sources:
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    index_strategy: str | None = None
    #: whether PIP_FIND_LINKS / UV_FIND_LINKS add to a local deploy's sources; false for
    #: a lock that resolves from its index alone (a local ``+cpu`` wheel there would
    #: otherwise stand in for the index's build of the same version)
    env_find_links: bool = True
    #: advice for a pinned file these sources cannot serve (another profile, a URL)
    unserved_hint: str = ""


@dataclass(frozen=True)
class Profile:
    name: str
    directory: Path
    python: str
    lock_file: Path
    lock_sha256: str | None
    sources: Sources
    expect: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    platform: str = "x86_64-manylinux_2_28"
    min_free_mb: int = 0

    @property
    def _arg(self) -> str:
        """How tools/make_lock.py names this profile."""
        return self.name if self.directory == PROFILES_DIR / self.name else str(self.directory)

    @property
    def has_lock(self) -> bool:
        return self.lock_file.is_file()

    def index_hosts(self) -> str:
        """The hosts the lock resolves from, for messages: ``download.pytorch.org and pypi.org``."""
        from urllib.parse import urlsplit

        urls = [*self.sources.extra_index_urls, *([self.sources.index_url] if self.sources.index_url else [])]
        hosts = list(dict.fromkeys(urlsplit(u).hostname or u for u in urls)) or ["pypi.org"]
        return " and ".join(hosts)

    def lock_bytes(self) -> bytes:
        if not self.lock_file.is_file():
            raise ConfigError(
                f"profile {self.name}: no lock at {self.lock_file}",
                hint=f"create it with `python tools/make_lock.py {self._arg}` in a dfo checkout on a "
                     f"machine that reaches {self.index_hosts()}, then commit it; or use profile "
                     "gpu-cu130, whose lock ships with dfo (see docs/deploy.md)")
        return self.lock_file.read_bytes()

    def load_lock(self) -> tuple[Lock, bytes]:
        """The parsed lock and its bytes; checks the lock against ``lock_sha256``."""
        data = self.lock_bytes()
        got = lock_hash(data)
        if self.lock_sha256 and got != self.lock_sha256:
            raise ConfigError(
                f"profile {self.name}: {self.lock_file.name} does not match its hash "
                f"(sha256 {got[:12]}..., profile.yaml pins {self.lock_sha256[:12]}...)",
                hint=f"the lock was edited by hand; regenerate it with "
                     f"`python tools/make_lock.py {self._arg}`")
        return parse_lock(data, source=f"profile {self.name}: {self.lock_file.name}"), data


def available() -> list[str]:
    return sorted(p.parent.name for p in PROFILES_DIR.glob("*/profile.yaml"))


def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name, or a profile directory by path."""
    p = Path(name_or_path).expanduser()
    if ("/" in name_or_path or name_or_path.startswith(".")) and (p / "profile.yaml").is_file():
        return _load_dir(p)
    d = PROFILES_DIR / name_or_path
    if (d / "profile.yaml").is_file() and "/" not in name_or_path:
        return _load_dir(d)
    names = available()
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f"did you mean {close[0]}?" if close else f"known profiles: {', '.join(names)}"
    raise ConfigError(f"unknown profile {name_or_path!r}",
                      hint=f"{hint} (or give a directory holding profile.yaml)")


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _load_dir(d: Path) -> Profile:
    f = d / "profile.yaml"
    try:
        doc = yaml.safe_load(f.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{f}{where}: not valid YAML", hint="fix the file") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{f}: expected a mapping", hint="see docs/deploy.md for the format")
    known = {"name", "description", "python", "platform", "lock", "lock_sha256", "sources",
             "min_free_mb", "expect"}
    extra = sorted(set(doc) - known)
    if extra:
        raise ConfigError(f"{f}: unknown key {extra[0]!r}",
                          hint=f"known keys: {', '.join(sorted(known))}")
    name = str(doc.get("name") or d.name)
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{f}: name {name!r} is not a plain name",
                          hint="use letters, digits, '.', '_' and '-' (it names the env directory)")
    python = doc.get("python")
    if not python:
        raise ConfigError(f"{f}: `python:` is required", hint='e.g. python: "3.11"')
    src = doc.get("sources") or {}
    if not isinstance(src, dict):
        raise ConfigError(f"{f}: `sources:` must be a mapping",
                          hint="keys: " + ", ".join(_SOURCE_KEYS))
    unknown = sorted(set(src) - set(_SOURCE_KEYS))
    if unknown:
        raise ConfigError(f"{f}: sources: unknown key {unknown[0]!r}", hint="keys: " + ", ".join(_SOURCE_KEYS))
    expect = doc.get("expect") or {}
    if not isinstance(expect, dict):
        raise ConfigError(f"{f}: `expect:` must be a mapping", hint="e.g. expect: {torch: 2.13.0+cpu}")
    for k in expect:
        if k not in EXPECT_FIELDS:
            close = difflib.get_close_matches(str(k), list(EXPECT_FIELDS), n=1)
            raise ConfigError(f"{f}: unknown expectation {k!r}",
                              hint=f"did you mean {close[0]}?" if close
                              else f"known: {', '.join(EXPECT_FIELDS)}")
    return Profile(
        name=name,
        directory=d.resolve(),
        python=str(python),
        lock_file=(d / str(doc.get("lock") or "requirements.lock")).resolve(),
        lock_sha256=(str(doc["lock_sha256"]) if doc.get("lock_sha256") else None),
        sources=Sources(
            index_url=src.get("index_url"),
            extra_index_urls=tuple(src.get("extra_index_urls") or ()),
            find_links=tuple(src.get("find_links") or ()),
            index_strategy=src.get("index_strategy"),
            env_find_links=bool(src.get("env_find_links", True)),
            unserved_hint=str(src.get("unserved_hint") or ""),
        ),
        expect=dict(expect),
        description=str(doc.get("description") or ""),
        platform=str(doc.get("platform") or "x86_64-manylinux_2_28"),
        min_free_mb=int(doc.get("min_free_mb") or 0),
    )
