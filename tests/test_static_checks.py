"""The type checker and the linter find nothing: mypy over ``dfo_contract/``,
``orchestrator/`` and ``trainer/`` (torch read as untyped) and ruff (pyflakes ``F`` and bugbear ``B``) over every package, each as
configured in pyproject.toml and pinned in tests/env/requirements.lock. Each runs as its own
process from the repository root; mypy reads no cache and writes none (``--cache-dir
/dev/null``), so no earlier run's cache is relied on. A failure shows every finding."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: what mypy checks (pyproject's ``[tool.mypy] files`` names the same)
TYPED = ("dfo_contract", "orchestrator", "trainer")
#: what ruff lints
LINTED = ("dfo_contract", "orchestrator", "trainer", "bench", "tools", "tests")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_mypy_finds_nothing():
    r = _run(["mypy", "--cache-dir", os.devnull, *TYPED])
    assert "No module named mypy" not in r.stderr, \
        "mypy is not installed: scripts/test.sh installs tests/env/requirements.lock"
    assert r.returncode == 0, f"mypy: {r.stdout}{r.stderr}"
    assert r.stdout.startswith("Success: no issues found"), r.stdout + r.stderr


def test_ruff_finds_nothing():
    r = _run(["ruff", "check", "--no-cache", "--output-format", "concise", *LINTED])
    assert "No module named ruff" not in r.stderr, \
        "ruff is not installed: scripts/test.sh installs tests/env/requirements.lock"
    assert r.returncode == 0, f"ruff: {r.stdout}{r.stderr}"
