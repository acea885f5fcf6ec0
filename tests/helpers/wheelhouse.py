"""The lab's offline wheelhouse: every wheel of the cpu lock (+ an older pyyaml)."""

from __future__ import annotations

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
