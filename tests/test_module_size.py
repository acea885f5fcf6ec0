"""No module of dfo's product code (orchestrator/, dfo_contract/, trainer/) is over 700
lines, and one over 400 is named in a warning: a module that grows past either is split by
what each part owns, not along a line count."""

from __future__ import annotations

import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "dfo_contract", "trainer")
#: over this many lines a module fails the test
MAX_LINES = 700
#: over this many lines a module is named in a warning
WARN_LINES = 400


def too_long(root: Path, limit: int = MAX_LINES) -> list[str]:
    out = []
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            n = len(p.read_text(encoding="utf-8").splitlines())
            if n > limit:
                out.append(f"{p.relative_to(root)}: {n} lines")
    return out


def test_no_product_module_is_over_700_lines():
    assert too_long(REPO) == []


def test_a_module_over_400_lines_is_named_in_a_warning():
    long = too_long(REPO, WARN_LINES)
    if long:
        warnings.warn(f"over {WARN_LINES} lines (split by what each part owns): " + "; ".join(long),
                      UserWarning, stacklevel=1)


def test_the_rule_sees_a_long_module(tmp_path):
    (tmp_path / "trainer" / "core").mkdir(parents=True)
    (tmp_path / "trainer" / "core" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "orchestrator").mkdir()
    (tmp_path / "orchestrator" / "ok.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "dfo_contract").mkdir()
    assert too_long(tmp_path) == [f"trainer/core/big.py: {MAX_LINES + 1} lines"]
    (tmp_path / "dfo_contract" / "mid.py").write_text("x = 1\n" * (WARN_LINES + 1))
    assert too_long(tmp_path, WARN_LINES) == [f"orchestrator/ok.py: {MAX_LINES} lines",
                                              f"dfo_contract/mid.py: {WARN_LINES + 1} lines",
                                              f"trainer/core/big.py: {MAX_LINES + 1} lines"]
