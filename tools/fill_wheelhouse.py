#!/usr/bin/env python3
"""Fill a wheelhouse directory with every wheel a profile's lock pins (for offline deploys).

    python tools/fill_wheelhouse.py cpu /srv/wheelhouse
    rsync -a /srv/wheelhouse/ pve:/srv/wheelhouse/   # then bind-mount it into the container
                                                      # (pct set 200 -mp0 /srv/wheelhouse,mp=/mnt/wheelhouse,ro=1)

Runs ``pip download --no-deps --only-binary=:all:`` for the profile's Python and
platform, in hash-checking mode (the lock's hashes), so only the exact files the lock
allows land there. Wheels not on the index (torch's +cpu/+cuXXX builds) come from
PIP_FIND_LINKS / UV_FIND_LINKS or ``--find-links``. Files already present are kept.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.plan.uv import local_find_links  # noqa: E402
from orchestrator.config.profiles import load_profile  # noqa: E402

# pip does not widen an explicit --platform to the older manylinux tags: list them
_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
              "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_12_x86_64",
              "manylinux2010_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64", "linux_x86_64")


def fill(profile: str, dest: Path, *, find_links: list[str] = (), quiet: bool = True) -> Path:
    prof = load_profile(profile)
    prof.load_lock()  # the lock must match its recorded hash before we trust it
    dest.mkdir(parents=True, exist_ok=True)
    pyver = prof.python.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", prof.python, "--implementation", "cp",
           "--abi", f"cp{pyver}", "--abi", "abi3", "--abi", "none",
           "--dest", str(dest), "-r", str(prof.lock_file)]
    for p in _PLATFORMS:
        cmd += ["--platform", p]
    if prof.sources.index_url:
        cmd += ["--index-url", prof.sources.index_url]
    for extra in prof.sources.extra_index_urls:
        cmd += ["--extra-index-url", extra]
    for fl in [*find_links, *local_find_links(dict(os.environ))]:
        cmd += ["--find-links", fl]
    if quiet:
        cmd.append("--quiet")
    subprocess.run(cmd, check=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("dest", type=Path)
    ap.add_argument("--find-links", action="append", default=[])
    args = ap.parse_args(argv)
    try:
        fill(args.profile, args.dest, find_links=args.find_links, quiet=False)
    except subprocess.CalledProcessError as e:
        print(f"fill_wheelhouse: pip download failed (exit {e.returncode})", file=sys.stderr)
        return 1
    n = len(list(args.dest.glob("*.whl")))
    print(f"fill_wheelhouse: {args.dest} holds {n} wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
