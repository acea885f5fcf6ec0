"""No module of dfo's product code (orchestrator/, dfo_contract/, trainer/) is over 400
lines: a module that grows past it is split by what each part owns."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "dfo_contract", "trainer")
MAX_LINES = 400


def too_long(root: Path, limit: int = MAX_LINES) -> list[str]:
    out = []
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            n = len(p.read_text(encoding="utf-8").splitlines())
            if n > limit:
                out.append(f"{p.relative_to(root)}: {n} lines")
    return out


def test_no_product_module_is_over_400_lines():
    assert too_long(REPO) == []


def test_the_rule_sees_a_long_module(tmp_path):
    (tmp_path / "trainer" / "core").mkdir(parents=True)
    (tmp_path / "trainer" / "core" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "orchestrator").mkdir()
    (tmp_path / "orchestrator" / "ok.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "dfo_contract").mkdir()
    assert too_long(tmp_path) == [f"trainer/core/big.py: {MAX_LINES + 1} lines"]
