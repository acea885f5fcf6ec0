"""dfo's own wheel: built from the checkout and cached by content, or repacked from an
installed (non-editable) dfo. Real uv venvs, real installs."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from orchestrator.engine import wheel as pw
from orchestrator.common.errors import DeployError

pytestmark = pytest.mark.timeout(300)


def _uv() -> str:
    import uv

    return uv.find_uv_bin()


def _names(whl: Path) -> set[str]:
    with zipfile.ZipFile(whl) as z:
        return {n for n in z.namelist() if not n.endswith("/RECORD")}


def test_build_is_cached_by_content_and_ships_profiles(tmp_path):
    a = pw.build(tmp_path)
    b = pw.build(tmp_path)
    assert a.path == b.path and a.sha256 == b.sha256 and a.digest == pw.source_digest(pw.source_root())
    names = _names(a.path)
    assert "orchestrator/config/profiles/cpu/requirements.lock" in names
    assert "orchestrator/config/profiles/cpu/profile.yaml" in names
    assert "trainer/__init__.py" in names and "orchestrator/engine/deploy.py" in names
    assert not any("__pycache__" in n for n in names)


def test_pinned_wheel_from_environment(tmp_path, monkeypatch, project_wheel):
    w = project_wheel
    monkeypatch.setenv("DFO_PROJECT_WHEEL", str(w.path))
    got = pw.build(tmp_path / "other")
    assert got.path == w.path and got.sha256 == w.sha256 and got.version == "0.1.0"
    monkeypatch.setenv("DFO_PROJECT_WHEEL", str(tmp_path / "nope.whl"))
    with pytest.raises(DeployError, match="is not a dfo wheel file"):
        pw.build(tmp_path)


def test_repack_from_a_non_editable_install(tmp_path, project_wheel):
    """dfo installed from its wheel (no checkout): deploy repacks the installed files."""
    w = project_wheel
    uv = _uv()
    a, b = tmp_path / "a", tmp_path / "b"
    for v in (a, b):
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(v)], check=True)
    subprocess.run([uv, "pip", "install", "-q", "--no-deps", "--python", str(a / "bin/python"),
                    str(w.path)], check=True)
    code = ("import sys; from pathlib import Path; from orchestrator.engine import wheel as p;"
            "assert p.source_root() is None; w = p.build(Path(sys.argv[1]));"
            "w2 = p.build(Path(sys.argv[1])); assert w2.sha256 == w.sha256; print(w.path)")
    out = subprocess.run([str(a / "bin/python"), "-c", code, str(tmp_path / "cache-a")],
                         capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    repacked = Path(out.stdout.strip())
    assert repacked.name == "dfo-0.1.0-py3-none-any.whl"
    assert _names(repacked) == {n for n in _names(w.path) if not n.endswith(("INSTALLER", "REQUESTED"))}
    r = subprocess.run([uv, "pip", "install", "-q", "--no-deps", "--python", str(b / "bin/python"),
                        str(repacked)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ok = subprocess.run([str(b / "bin/python"), "-c",
                         "import orchestrator.common.errors, trainer; from importlib.metadata import version;"
                         "print(version('dfo'))"], capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.strip() == "0.1.0", ok.stderr
