"""A real tmpfs of a chosen size (root only) for tests of a full disk, and filling one up.

``tmpfs`` is a fixture: ``mount(size)`` mounts a fresh tmpfs of that many bytes at a new
directory, unmounted after the test; without root it skips (fails when CI is set). A tmpfs
gives the real ENOSPC and a real ``df``, unlike RLIMIT_FSIZE (EFBIG, and ``df`` unchanged)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest


@pytest.fixture
def tmpfs(tmp_path):
    """``mount(size)``: a fresh tmpfs of that size (bytes) at a new directory; unmounted
    after the test."""
    if os.geteuid() != 0:
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on"):
            pytest.fail("mounting a tmpfs needs root", pytrace=False)
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(size: int, where: Path | None = None) -> Path:
        d = where or tmp_path / f"fs{len(mounted)}"
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                       check=True, timeout=60)
        mounted.append(d)
        return d

    yield mount
    for d in reversed(mounted):
        subprocess.run(["umount", "-l", str(d)], timeout=60)


def fill(fs: Path, leave: int) -> None:
    """Fill ``fs`` until ``leave`` bytes (or fewer) are free."""
    st = os.statvfs(fs)
    free = st.f_bavail * st.f_frsize
    with open(fs / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    st = os.statvfs(fs)
    assert st.f_bavail * st.f_frsize <= leave + st.f_frsize


@pytest.fixture
def read_only(tmp_path):
    """``make(where)``: ``where`` (created) becomes a read-only bind mount of itself, as a
    filesystem mounted read-only is; unmounted after the test."""
    if os.geteuid() != 0:
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on"):
            pytest.fail("a read-only bind mount needs root", pytrace=False)
        pytest.skip("a read-only bind mount needs root")
    mounted: list[Path] = []

    def make(where: Path, between=lambda: None, on_busy=lambda: None) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(where), str(where)], check=True, timeout=60)
        mounted.append(where)
        between()          # (tests of the fixture) runs between the bind and the remount
        remount_ro(where, on_busy)
        return where

    yield make
    for d in reversed(mounted):
        subprocess.run(["umount", "-l", str(d)], timeout=60)


def remount_ro(where: Path, on_busy=lambda: None) -> int:
    """Make the bind mount at ``where`` read-only; the number of tries it took.

    A file a live process opened for writing through the bind mount makes the remount
    EBUSY ("mount point is busy") until it is closed, so a busy remount is tried again
    (``on_busy`` is called after each) for up to a minute."""
    deadline = time.monotonic() + 60
    tries = 0
    while True:
        tries += 1
        p = subprocess.run(["mount", "-o", "remount,bind,ro", str(where)],
                           capture_output=True, text=True, timeout=60)
        if p.returncode == 0:
            return tries
        if "busy" not in p.stderr or time.monotonic() > deadline:
            raise subprocess.CalledProcessError(p.returncode, p.args, p.stdout, p.stderr)
        on_busy()
        time.sleep(0.01)
