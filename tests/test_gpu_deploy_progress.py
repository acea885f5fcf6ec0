"""Deploy's download/install progress from uv's output, and the env's size (pure parts)."""

from __future__ import annotations

import functools
import http.server
import os
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.plan.uv_progress import UvProgress, human_bytes, parse_du_k

#: uv pip sync's output (uv prints these without a terminal too; the sizes of the gpu-cu130 lock)
UV_LINES = """\
Resolved 57 packages in 3ms
Downloading nvidia-cudnn-cu13 (349.9MiB)
Downloading torch (506.1MiB)
Downloading nvidia-cublas (423.1MiB)
 Downloaded nvidia-cublas
Downloading triton (179.5MiB)
 Downloaded torch
 Downloaded triton
 Downloaded nvidia-cudnn-cu13
Prepared 57 packages in 1m 02s
Installed 57 packages in 9.14s
 + torch==2.11.0
"""


def test_progress_summaries():
    p = UvProgress()
    shown = [s for s in (p.feed(ln) for ln in UV_LINES.splitlines()) if s]
    assert shown[0] == "Resolved 57 packages in 3ms"
    assert shown[4] == "downloading: 1 of 3 large files done, 423.1 MiB of 1.2 GiB; nvidia-cublas"
    assert shown[-3] == "downloading: 4 of 4 large files done, 1.4 GiB of 1.4 GiB; nvidia-cudnn-cu13"
    assert shown[-1] == "Installed 57 packages in 9.14s"
    assert p.feed(" + torch==2.11.0") is None


def test_env_size():
    assert parse_du_k("6291456\t/root/dfo/envs/gpu-cu130-5bf7d6027fc6\n") == 6 << 30
    assert parse_du_k("du: cannot access 'x'") is None
    assert human_bytes(6 << 30) == "6.0 GiB" and human_bytes(512) == "512 B"


# ------------------------------------------------------------------ a real deploy over a loopback index

def _wheel(dest: Path, size: int) -> str:
    """A pure-Python wheel holding ``size`` incompressible bytes; its sha256."""
    import base64
    import hashlib
    import zipfile

    def rec(name: str, b: bytes) -> str:
        d = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
        return f"{name},sha256={d},{len(b)}"

    files = {"bigpkg/__init__.py": b"", "bigpkg/blob.bin": os.urandom(size),
             "bigpkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: bigpkg\nVersion: 1.0\n",
             "bigpkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                           b"Tag: py3-none-any\n"}
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as z:
        for n, b in files.items():
            z.writestr(n, b)
        z.writestr("bigpkg-1.0.dist-info/RECORD",
                   "\n".join([rec(n, b) for n, b in files.items()] + ["bigpkg-1.0.dist-info/RECORD,,"]) + "\n")
    return hashlib.sha256(dest.read_bytes()).hexdigest()


@pytest.fixture
def loopback_index(tmp_path):
    """A PEP 503 index on 127.0.0.1 (http.server's listings) serving bigpkg 1.0 (3 MiB)."""
    root = tmp_path / "index"
    (root / "simple" / "bigpkg").mkdir(parents=True)
    sha = _wheel(root / "simple" / "bigpkg" / "bigpkg-1.0-py3-none-any.whl", 3 << 20)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/simple", sha
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.slow
def test_deploy_shows_download_progress_and_env_size(loopback_index, tmp_path, monkeypatch,
                                                      project_wheel):
    from orchestrator.config.inventory import HostConfig
    from orchestrator.engine.deploy import Deployer
    from orchestrator.transport import LocalTransport

    url, sha = loopback_index
    prof = tmp_path / "bigenv"
    prof.mkdir()
    (prof / "profile.yaml").write_text(
        f'name: bigenv\npython: "{sys.version_info.major}.{sys.version_info.minor}"\n'
        f"sources: {{index_url: {url}}}\nexpect: {{}}\n")
    (prof / "requirements.lock").write_text(f"bigpkg==1.0 \\\n    --hash=sha256:{sha}\n")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))  # nothing from an earlier run
    events: list[tuple] = []
    host = HostConfig(name="local", transport="local", root=str(tmp_path / "root"))
    r = Deployer(LocalTransport("local"), host, profile=str(prof), wheel=project_wheel,
                 environ={}, on_event=lambda *a: events.append(a)).deploy()
    assert r.action == "create", r
    lines = [e[3] for e in events if e[0] == "install" and e[1] == "line"]
    assert "downloading: 0 of 1 large files done, 0 B of 3.0 MiB; bigpkg" in lines, lines
    assert "downloading: 1 of 1 large files done, 3.0 MiB of 3.0 MiB; bigpkg" in lines, lines
    assert r.env_bytes is not None and r.env_bytes > 3 << 20
    install = next(s for s in r.stages if s.stage == "install")
    assert f"env is {human_bytes(r.env_bytes)}" in install.detail
    assert r.to_json()["env_bytes"] == r.env_bytes
