"""Drift against real uv output: a root with a space in it (`deploy --check` must not
report drift, exit 7, because uv writes the wheel's URL as `file:///.../my%20dfo/...`).

A real `uv venv` + `uv pip install` of a small hand-made wheel named like dfo's, from a
directory whose path has a space (and a `%`), offline, with a uv cache of its own; then
`uv pip freeze` is compared with the wheel's path the way `dfo deploy --check` does."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from orchestrator.plan.drift import diff, parse_freeze
from orchestrator.config.lockfile import parse_lock


def _wheel(path: Path, name: str = "dfo", version: str = "0.1.0") -> Path:
    files = {f"{name}_probe/__init__.py": b"",
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rec = "".join(f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}\n"
                  for k, v in files.items()) + f"{name}-{version}.dist-info/RECORD,,\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr(f"{name}-{version}.dist-info/RECORD", rec)
    return path


def test_a_wheel_under_a_root_with_a_space_is_not_drift(tmp_path):
    uv_mod = pytest.importorskip("uv")
    uv = uv_mod.find_uv_bin()
    root = tmp_path / "my dfo 50%"
    wheel = _wheel(root / "wheels" / "ab12" / "dfo-0.1.0-py3-none-any.whl")
    env = dict(os.environ, UV_CACHE_DIR=str(tmp_path / "uv-cache"), UV_OFFLINE="1", UV_NO_CONFIG="1")
    venv = root / "envs" / "cpu-x"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], env=env, check=True,
                   capture_output=True, timeout=300)
    py = str(venv / "bin" / "python")
    subprocess.run([uv, "pip", "install", "-q", "--no-deps", "--python", py, str(wheel)], env=env,
                   check=True, capture_output=True, timeout=300)
    freeze = subprocess.run([uv, "pip", "freeze", "--python", py], env=env, check=True,
                            capture_output=True, text=True, timeout=300).stdout
    assert "my%20dfo%2050%25" in freeze  # what uv writes: percent-encoded
    lock = parse_lock(f"unrelated==1.0 --hash=sha256:{'0' * 64}\n")
    assert diff(lock, parse_freeze(freeze), project_wheel=str(wheel), ignore=["unrelated"]).clean
    # another wheel under the same root is still drift
    other = str(root / "wheels" / "cd34" / "dfo-0.1.0-py3-none-any.whl")
    assert diff(lock, parse_freeze(freeze), project_wheel=other, ignore=["unrelated"]).project_differs
