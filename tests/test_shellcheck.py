"""Every shell script dfo ships (``orchestrator/**/*.sh``, package data) and every script in
``scripts/`` passes shellcheck. Skipped when shellcheck is missing, unless CI is set (then
missing shellcheck fails: scripts/test.sh installs it)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*(REPO / "orchestrator").rglob("*.sh"), *(REPO / "scripts").glob("*.sh")])


def _shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found:
        return found
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail("shellcheck is not installed (CI=true): apt-get install shellcheck")
    pytest.skip("shellcheck is not installed (apt-get install shellcheck); CI runs this check")


def test_there_are_scripts_to_check():
    names = {p.name for p in SCRIPTS}
    assert {"deploy_state.sh", "deploy_switch.sh", "launch_probe.sh", "test.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(REPO)) for p in SCRIPTS])
def test_shellcheck(script: Path):
    r = subprocess.run([_shellcheck(), "--format=gcc", str(script)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_package_scripts_are_package_data():
    """pyproject ships plan/scripts/*.sh, so an installed wheel has them."""
    text = (REPO / "pyproject.toml").read_text()
    assert '"plan/scripts/*.sh"' in text
    for p in (REPO / "orchestrator").rglob("*.sh"):
        assert p.parent == REPO / "orchestrator" / "plan" / "scripts", f"{p} is not under plan/scripts"
