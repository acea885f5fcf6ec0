"""The run's caching g++ (tests/helpers/cxx_cache.py) with the real g++: a build asked
again, into another output path, is copied from the store; another source, other flags
or a failed build are not taken from it; what is no build passes straight through."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.helpers.cxx_cache import install

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

SRC = 'extern "C" int answer() { return %d; }\n'


@pytest.fixture
def gxx(tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("DFO_TEST_CXX_CACHE", raising=False)
    path = install(tmp_path / "shared")
    assert path is not None
    return path, tmp_path / "shared" / "cxx" / "store"


def build(gxx: str, src, out, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([gxx, str(src), *flags, "-shared", "-fPIC", "-o", str(out)],
                          capture_output=True, text=True, timeout=300)


def test_the_same_build_is_compiled_once_and_copied_after(gxx, tmp_path):
    path, store = gxx
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    src_a, src_b = tmp_path / "a" / "k.cpp", tmp_path / "b" / "k.cpp"
    src_a.write_text(SRC % 42)
    src_b.write_text(SRC % 42)          # the same kernel in another cache directory
    assert build(path, src_a, tmp_path / "a" / "k.so").returncode == 0
    stored = list(store.iterdir())
    assert len(stored) == 1
    # the store's copy is what the second build gets: make it recognisable
    marker = stored[0].read_bytes() + b"\0from-the-store"
    stored[0].write_bytes(marker)
    assert build(path, src_b, tmp_path / "b" / "k.so").returncode == 0
    assert (tmp_path / "b" / "k.so").read_bytes() == marker
    assert len(list(store.iterdir())) == 1


def test_other_content_or_flags_build_anew_and_failures_are_not_kept(gxx, tmp_path):
    path, store = gxx
    src = tmp_path / "k.cpp"
    src.write_text(SRC % 1)
    assert build(path, src, tmp_path / "1.so").returncode == 0
    src.write_text(SRC % 2)             # same path, other content
    assert build(path, src, tmp_path / "2.so").returncode == 0
    assert build(path, src, tmp_path / "3.so", "-O2").returncode == 0
    assert len(list(store.iterdir())) == 3
    src.write_text("this is not C++\n")
    r = build(path, src, tmp_path / "4.so")
    assert r.returncode != 0 and "error" in r.stderr
    assert len(list(store.iterdir())) == 3 and not (tmp_path / "4.so").exists()


def test_no_build_passes_through_and_off_means_none(gxx, monkeypatch, tmp_path):
    path, store = gxx
    r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    real = subprocess.run(["g++", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == real.stdout
    assert not list(store.iterdir())
    monkeypatch.setenv("DFO_TEST_CXX_CACHE", "0")
    assert install(tmp_path / "other") is None
    monkeypatch.setenv("DFO_TEST_CXX_CACHE", "1")
    monkeypatch.setenv("CXX", "/usr/bin/clang++")
    assert install(tmp_path / "other") is None
