"""The test env is pinned: tests/env/requirements.lock holds every package scripts/test.sh
installs, hash-locked, in step with pyproject.toml and the `cpu` profile; the torch +cpu
fetch in scripts/test.sh takes only a file with the lock's hash (a real HTTP server on
loopback)."""

from __future__ import annotations

import hashlib
import http.server
import re
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from orchestrator.config.profiles import load_profile

ROOT = Path(__file__).resolve().parent.parent
TEST_ENV = ROOT / "tests" / "env"


def _pins() -> dict[str, str]:
    lock, _ = load_profile(str(TEST_ENV)).load_lock()  # checks lock_sha256 and every hash
    return {name: e.version for name, e in lock.entries.items()}


def test_lock_matches_its_recorded_hash_and_pins_every_package():
    prof = load_profile(str(TEST_ENV))
    assert prof.lock_sha256 and prof.python == "3.11"
    pins = _pins()
    assert len(pins) > 20 and all(pins.values())


def test_every_dependency_of_dfo_and_its_test_extras_is_pinned_within_its_range():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = [*meta["project"]["dependencies"], *meta["project"]["optional-dependencies"]["trainer"],
            *meta["project"]["optional-dependencies"]["dev"], *meta["build-system"]["requires"]]
    pins = _pins()
    missing, outside = [], []
    for text in reqs:
        r = Requirement(text)
        name = re.sub(r"[-_.]+", "-", r.name).lower()
        if name not in pins:
            missing.append(name)
        elif not r.specifier.contains(pins[name], prereleases=True):
            outside.append(f"{name}=={pins[name]} not in {r.specifier}")
    assert not missing, f"not in tests/env/requirements.lock (python tools/make_lock.py tests/env): {missing}"
    assert not outside


def test_torch_and_transformers_are_the_cpu_profiles():
    cpu, _ = load_profile("cpu").load_lock()
    pins = _pins()
    for name in ("torch", "transformers", "safetensors", "numpy"):
        assert pins[name] == cpu.version(name), name


def test_test_sh_names_the_locked_torch_wheel():
    text = (ROOT / "scripts" / "test.sh").read_text()
    wheel = re.search(r"^torch_cpu=(\S+)$", text, re.M).group(1)
    assert wheel.startswith(f"torch-{_pins()['torch']}-cp311-")
    assert "--require-hashes" in text and "tests/env/requirements.lock" in text


class _Files(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.endswith(".whl"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body)
        else:
            self.send_error(404)

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _fetch(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_wheel.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_fetch_keeps_a_file_with_the_locked_hash(server, tmp_path):
    _Files.body = b"wheel bytes" * 1000
    want = hashlib.sha256(_Files.body).hexdigest()
    p = _fetch(f"{server}/t.whl", str(tmp_path / "c"), "t.whl", want)
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()).read_bytes() == _Files.body
    assert [f.name for f in (tmp_path / "c").iterdir()] == ["t.whl"]


def test_fetch_refuses_another_file_and_leaves_nothing(server, tmp_path):
    _Files.body = b"not the wheel"
    p = _fetch(f"{server}/t.whl", str(tmp_path / "c"), "t.whl", "0" * 64)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.count("\n") == 1 and f"{server}/t.whl" in p.stderr and "lock's 000000000000" in p.stderr
    assert list((tmp_path / "c").iterdir()) == []
    p = _fetch(f"{server}/missing", str(tmp_path / "c"), "t.whl", "0" * 64)
    assert p.returncode == 2 and "404" in p.stderr and list((tmp_path / "c").iterdir()) == []
