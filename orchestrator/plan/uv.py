"""uv on this side, pure: where extra wheels are found (``PIP_FIND_LINKS``/``UV_FIND_LINKS``)
and uv's error output as one-line ``DeployError``s with the fix. uv only ever installs into
an env that is not envs/current (a new one, or one re-synced before the switch), so each
says envs/current is untouched."""

from __future__ import annotations

import re

from ..common.errors import DeployError
from .uv_failure import classify_uv_failure


def local_find_links(environ: dict[str, str]) -> list[str]:
    """PIP_FIND_LINKS / UV_FIND_LINKS (whitespace or comma separated) on this machine."""
    out: list[str] = []
    for var in ("UV_FIND_LINKS", "PIP_FIND_LINKS"):
        for item in re.split(r"[\s,]+", environ.get(var, "")):
            if item and item not in out:
                out.append(item)
    return out


def describe_sources(args: list[str]) -> str:
    """uv's source arguments for people: ``index https://pypi.org/simple, find-links /w``."""
    out = []
    for flag, value in zip(args, args[1:] + [""], strict=False):  # each flag and its value
        if flag == "--index-url":
            out.append("PyPI" if value.rstrip("/") == "https://pypi.org/simple" else f"index {value}")
        elif flag == "--extra-index-url":
            out.append(f"index {value}")
        elif flag == "--find-links":
            out.append(f"find-links {value}")
        elif flag == "--no-index":
            out.append("no index")
    return ", ".join(out) or "uv's defaults"


def unserved_package(text: str) -> str | None:
    """The pinned requirement uv could find no file for (``torch==2.13.0+cpu``), from its
    resolver's words, or None."""
    m = re.search(r"there is no version of ([A-Za-z0-9_.\-]+==[^\s,]+)", text)
    return m.group(1) if m else None


def translate_uv_error(text: str, *, host: str, root: str, what: str,
                       sources: str = "", unserved_hint: str = "") -> DeployError:
    """``sources`` names where uv looked (for people); ``unserved_hint`` is the profile's
    own advice for a pin its sources cannot serve."""
    low = text.lower()
    if "no space left on device" in low:
        return DeployError(f"disk full on {host} while {what} (under {root})",
                           hint="free space on the target, then deploy again; envs/current is untouched")
    m = re.search(r"hash mismatch for `?([^`\s]+)`?", text, re.I)
    if m or "hash mismatch" in low:
        pkg = m.group(1) if m else "a package"
        hashes = re.findall(r"sha256:([0-9a-f]{64})", text)
        got = f": lock sha256 {hashes[0][:12]}..., file {hashes[-1][:12]}..." if len(hashes) >= 2 else ""
        return DeployError(f"{pkg}: the file does not match the lock's sha256 (hash mismatch){got}",
                           hint="the wheelhouse/index serves a different build than the lock pins; "
                                "fix the wheelhouse or regenerate the lock with tools/make_lock.py; "
                                "envs/current is untouched")
    pin = unserved_package(text)
    if pin:
        fix = "add a wheelhouse that holds it (hosts.yaml `wheelhouse:`) or `dfo deploy --find-links DIR|URL`"
        return DeployError(f"{pin} is not served by the package sources on {host}"
                           + (f" ({sources})" if sources else ""),
                           hint=f"{fix}{'; ' + unserved_hint if unserved_hint else ''}; "
                                "envs/current is untouched")
    m = re.search(r"Because ([A-Za-z0-9_.\-]+)(==[^\s,]+)? was not found", text)
    req = re.search(r"you require ([A-Za-z0-9_.\-]+==[^\s,]+)", text)
    if m or "not found in the provided package locations" in low or "no matching distribution" in low:
        pkg = (req.group(1) if req else m.group(1) + (m.group(2) or "")) if m else "a locked package"
        return DeployError(f"{pkg} is not available from the package sources on {host}",
                           hint="add it to the host's wheelhouse (see docs/deploy.md: "
                                "`pip download`), or set index_url in hosts.yaml; "
                                "envs/current is untouched")
    if "failed to fetch" in low or "dns error" in low or "connection refused" in low \
            or "network is unreachable" in low:
        return DeployError(f"{host} cannot reach the package index while {what}",
                           hint="give the host a wheelhouse (hosts.yaml `wheelhouse:`) for "
                                "offline installs, or fix its network; envs/current is untouched")
    f = classify_uv_failure(text)
    if f.kind == "interpreter_broken":
        said = f": {f.said}" if f.said else ""
        code = f" (exit {f.exit_code})" if f.exit_code is not None else ""
        where = f" ({f.origin})" if f.origin else ""
        return DeployError(f"{what} failed on {host}: the Python interpreter {f.interpreter}"
                           f"{where} does not run{code}{said}",
                           hint="fix or remove it from the host's PATH (a broken pyenv shim?), "
                                "or point hosts.yaml `python:` at a working interpreter's path; "
                                "envs/current is untouched")
    if f.kind == "no_interpreter":
        return DeployError(f"{what} failed on {host}: {f.cause}",
                           hint="install that Python on the host, or point hosts.yaml `python:` "
                                "at an interpreter it has; envs/current is untouched")
    return DeployError(f"{what} failed on {host}: {f.cause}",
                       hint="run with -vv for uv's full output; envs/current is untouched")
