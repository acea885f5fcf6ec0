"""The lab's offline wheelhouse: every wheel of the cpu lock (+ an older pyyaml), filled
once per test run and copied to where tests need it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

OLD_PYYAML = "6.0.2"


def fill_wheelhouse(dest: Path) -> None:
    """Every wheel of the cpu lock (+ an older pyyaml for the drift test) into ``dest``.
    PyPI is reachable from this machine, not from the container; torch's +cpu wheel
    comes from PIP_FIND_LINKS / UV_FIND_LINKS."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    try:
        from fill_wheelhouse import _PLATFORMS, fill
    finally:
        sys.path.pop(0)
    fill("cpu", dest)
    if not list(dest.glob(f"[Pp][Yy][Yy][Aa][Mm][Ll]-{OLD_PYYAML}-*.whl")):
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
               "--dest", str(dest), f"pyyaml=={OLD_PYYAML}"]
        for p in _PLATFORMS:
            cmd += ["--platform", p]
        subprocess.run(cmd, check=True)


def shared_wheelhouse(shared: Path) -> Path:
    """``fill_wheelhouse`` once per test run, in the run-shared dir (tests/helpers/shared.py),
    keyed by the cpu lock: every test that needs these wheels links or copies them from here."""
    from orchestrator.config.profiles import load_profile
    from tests.helpers.shared import built_once

    lock = load_profile("cpu").lock_file.read_bytes()
    key = hashlib.sha256(lock + OLD_PYYAML.encode()).hexdigest()
    return built_once(shared, "wheelhouse", key, fill_wheelhouse)


def is_old_pyyaml(path: Path) -> bool:
    """The drift test's older pyyaml (not in the lock)."""
    return path.name.lower().startswith(f"pyyaml-{OLD_PYYAML}-")


def copy_missing(src: Path, dest: Path) -> None:
    """Every wheel of ``src`` that ``dest`` lacks (a hard link where the file system allows)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("*.whl")):
        target = dest / f.name
        if target.exists():
            continue
        tmp = dest / f".{f.name}.tmp-{os.getpid()}"
        try:
            os.link(f, tmp)
        except OSError:
            shutil.copy2(f, tmp)
        os.replace(tmp, target)
