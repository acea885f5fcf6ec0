#!/usr/bin/env python3
"""(Re)generate a profile's hash-pinned lock with ``uv pip compile --generate-hashes``.

    python tools/make_lock.py cpu                      # a shipped profile, by name
    python tools/make_lock.py path/to/my-profile       # a profile directory
    python tools/make_lock.py gpu-cu128 --find-links ~/wheels

Reads ``<profile>/requirements.in`` and ``profile.yaml`` (python, platform, sources),
writes ``<profile>/requirements.lock`` (temporary name, then rename) and records its
sha256 as ``lock_sha256:`` in profile.yaml. Find-links come from ``--find-links``,
``sources.find_links``, and the standard PIP_FIND_LINKS / UV_FIND_LINKS variables, so
no machine's path is written into the lock. ``--no-env-find-links`` ignores the
variables (a lock that must resolve from the profile's index alone, e.g. gpu-cu130 from
PyPI); ``--cache-dir`` gives uv its own cache (resolving downloads only metadata).

The lock starts with a ``# dfo-lock: python=... platform=...`` line naming what it was
compiled for; tests/test_gpu_lock.py checks it against profile.yaml. See docs/deploy.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dfo_contract.fsio import atomic_write_bytes, atomic_write_text, sha256_bytes  # noqa: E402
from orchestrator.plan.uv import local_find_links  # noqa: E402
from orchestrator.config.lockfile import parse_lock  # noqa: E402
from orchestrator.config.profiles import load_profile  # noqa: E402


def uv_bin() -> str:
    try:
        import uv

        return uv.find_uv_bin()
    except ImportError:
        return "uv"


HEADER = "# dfo-lock:"


def header_line(python: str, platform: str) -> str:
    return f"{HEADER} python={python} platform={platform}"


def with_header(data: bytes, python: str, platform: str) -> bytes:
    """The lock with one ``# dfo-lock: python=X platform=Y`` line after uv's header
    (replacing an older one), so the lock says what it was compiled for."""
    lines = [ln for ln in data.decode().splitlines() if not ln.startswith(HEADER)]
    at = 0
    while at < len(lines) and lines[at].startswith("#"):
        at += 1
    lines.insert(at, header_line(python, platform))
    return ("\n".join(lines) + "\n").encode()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="profile name or directory")
    ap.add_argument("--find-links", action="append", default=[], metavar="DIR|URL")
    ap.add_argument("--upgrade", action="store_true", help="ignore the existing lock's pins")
    ap.add_argument("--no-env-find-links", action="store_true",
                    help="ignore PIP_FIND_LINKS / UV_FIND_LINKS (resolve from the profile's sources)")
    ap.add_argument("--cache-dir", metavar="DIR", help="uv's cache for this resolution")
    args = ap.parse_args(argv)

    prof = load_profile(args.profile)
    req_in = prof.directory / "requirements.in"
    if not req_in.is_file():
        print(f"make_lock: {req_in} does not exist", file=sys.stderr)
        return 2
    s = prof.sources
    cmd = [uv_bin(), "pip", "compile", str(req_in), "--generate-hashes", "--quiet",
           "--python-version", prof.python, "--python-platform", prof.platform,
           "--custom-compile-command", f"python tools/make_lock.py {args.profile}"]
    env_links = [] if args.no_env_find_links else local_find_links(dict(os.environ))
    for fl in [*args.find_links, *s.find_links, *env_links]:
        cmd += ["--find-links", fl]
    if s.index_url:
        cmd += ["--index-url", s.index_url]
    for extra in s.extra_index_urls:
        cmd += ["--extra-index-url", extra]
    if s.index_strategy:
        cmd += ["--index-strategy", s.index_strategy]
    if args.upgrade:
        cmd.append("--upgrade")
    if args.no_env_find_links:
        cmd.append("--no-config")  # nor a uv.toml's find-links
    if args.cache_dir:
        cmd += ["--cache-dir", args.cache_dir]
    with tempfile.TemporaryDirectory(dir=prof.directory, prefix=".lock-") as tmp:
        out = Path(tmp) / "requirements.lock"
        if prof.lock_file.is_file() and not args.upgrade:
            out.write_bytes(prof.lock_file.read_bytes())  # keep existing pins where possible
        cmd += ["-o", str(out)]
        print("make_lock:", " ".join(cmd), file=sys.stderr)
        p = subprocess.run(cmd)
        if p.returncode != 0:
            print(f"make_lock: uv pip compile failed (exit {p.returncode})", file=sys.stderr)
            return p.returncode
        data = with_header(out.read_bytes(), prof.python, prof.platform)
        lock = parse_lock(data, source=str(out))  # every entry pinned and hashed
    atomic_write_bytes(prof.lock_file, data)
    digest = sha256_bytes(data)
    yml = prof.directory / "profile.yaml"
    text = yml.read_text()
    if re.search(r"^lock_sha256:.*$", text, re.M):
        text = re.sub(r"^lock_sha256:.*$", f"lock_sha256: {digest}", text, flags=re.M)
    else:
        text = text.rstrip("\n") + f"\nlock_sha256: {digest}\n"
    atomic_write_text(yml, text)
    print(f"make_lock: {prof.lock_file} ({len(lock.entries)} packages), sha256 {digest[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
