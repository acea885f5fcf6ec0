"""deploy's constant shell scripts, run for real with bash + flock on this machine:
the state probe, the deploy lease, the locked wrapper, the atomic switch under run.lock,
and the cleanup of half-built envs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dfo_contract.env_fingerprint import EnvComplete

from orchestrator.plan import deploy_plan as dp


def sh(script: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(dp.script_argv(script, *args), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "envs").mkdir(parents=True)
    (r / "locks").mkdir()
    return r


def _env(root: Path, name: str, complete: bool = True) -> Path:
    d = root / "envs" / name
    (d / "bin").mkdir(parents=True)
    if complete:
        (d / ".dfo-complete").write_text("{}\n")
    return d


def _lease(root: Path, token: str, *, takeover: str = "-", wait: int = 2):
    return sh(dp.LEASE_SCRIPT, str(root / "locks/deploy.lock"), str(root / "locks/deploy.owner"),
              token, '{"pid": 1}', str(dp.LEASE_STALE_S), takeover, str(wait))


def test_lease_excludes_a_second_deploy_and_is_released(root):
    assert "@acquired" in _lease(root, "tokA").stdout
    r = _lease(root, "tokB")
    assert r.returncode == dp.EXIT_BUSY and r.stdout.startswith("@held\ttokA ")
    assert "@acquired" in _lease(root, "tokA").stdout  # re-entrant for its owner
    sh(dp.RELEASE_SCRIPT, str(root / "locks/deploy.lock"), str(root / "locks/deploy.owner"), "tokA")
    assert not (root / "locks/deploy.owner").exists()
    assert "@acquired" in _lease(root, "tokB").stdout


def test_stale_or_taken_over_lease(root):
    assert "@acquired" in _lease(root, "dead").stdout
    assert _lease(root, "new").returncode == dp.EXIT_BUSY
    assert "@acquired" in _lease(root, "new", takeover="dead").stdout  # owner known dead
    owner = root / "locks/deploy.owner"
    old = time.time() - dp.LEASE_STALE_S - 5
    os.utime(owner, (old, old))
    assert "@acquired" in _lease(root, "third").stdout  # stale by age


def test_locked_wrapper_runs_only_for_the_lease_owner(root):
    lock, owner = str(root / "locks/deploy.lock"), str(root / "locks/deploy.owner")
    assert "@acquired" in _lease(root, "tokA").stdout
    ok = subprocess.run(dp.locked_argv(lock, owner, "tokA", ["echo", "it ran"]),
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and ok.stdout == "it ran\n"
    bad = subprocess.run(dp.locked_argv(lock, owner, "tokB", ["echo", "it ran"]),
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == dp.EXIT_BUSY and "no longer holds" in bad.stderr and not bad.stdout
    rc = subprocess.run(dp.locked_argv(lock, owner, "tokA", ["sh", "-c", "exit 3"]), timeout=30)
    assert rc.returncode == 3


def test_locked_command_keeps_the_flock_while_it_runs(root):
    lock, owner = str(root / "locks/deploy.lock"), str(root / "locks/deploy.owner")
    assert "@acquired" in _lease(root, "tokA").stdout
    started, done = root / "started", root / "done"
    # the command runs until the test is done with it (not for a fixed time)
    p = subprocess.Popen(dp.locked_argv(lock, owner, "tokA", [
        "sh", "-c", 'touch "$1"; while [ ! -e "$2" ]; do sleep 0.05; done', "sh",
        str(started), str(done)]))
    try:
        deadline = time.monotonic() + 30
        while not started.exists():  # the command runs: the wrapper holds the flock
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        r = _lease(root, "tokB", takeover="tokA", wait=1)  # even a takeover waits for the flock
        assert r.returncode == dp.EXIT_BUSY and r.stdout.startswith("@busy")
    finally:
        done.touch()
        p.wait(60)
    assert "@acquired" in _lease(root, "tokB", takeover="tokA").stdout


def test_switch_is_atomic_and_keeps_previous(root):
    _env(root, "cpu-a")
    _env(root, "cpu-b")
    envs, runlock = str(root / "envs"), str(root / "locks/run.lock")
    assert "@switched" in sh(dp.SWITCH_SCRIPT, envs, "cpu-a", "", runlock).stdout
    assert os.readlink(root / "envs/current") == "cpu-a"
    assert "@switched" in sh(dp.SWITCH_SCRIPT, envs, "cpu-b", "cpu-a", runlock).stdout
    assert os.readlink(root / "envs/current") == "cpu-b"
    assert os.readlink(root / "envs/previous") == "cpu-a"
    assert not list((root / "envs").glob(".*tmp*"))


def test_switch_retires_older_envs_but_never_current_or_previous(root):
    for n in ("cpu-a", "cpu-a.2", "cpu-a.3"):
        _env(root, n)
    (root / "envs/cpu-a/lib").mkdir()
    envs, runlock = str(root / "envs"), str(root / "locks/run.lock")
    assert "@switched" in sh(dp.SWITCH_SCRIPT, envs, "cpu-a.2", "cpu-a", runlock).stdout
    r = sh(dp.SWITCH_SCRIPT, envs, "cpu-a.3", "cpu-a.2", runlock,
           "cpu-a", "cpu-a.2", "cpu-a.3", "current", "../envs", "")
    assert r.returncode == 0 and "@switched" in r.stdout, r.stderr
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("@retired")] == ["@retired\tcpu-a"]
    assert sorted(os.listdir(envs)) == ["cpu-a.2", "cpu-a.3", "current", "previous"]
    assert os.readlink(root / "envs/current") == "cpu-a.3"
    assert os.readlink(root / "envs/previous") == "cpu-a.2"


def test_switch_refuses_an_incomplete_env(root):
    _env(root, "cpu-half", complete=False)
    r = sh(dp.SWITCH_SCRIPT, str(root / "envs"), "cpu-half", "", str(root / "locks/run.lock"))
    assert r.returncode != 0 and "not a complete env" in r.stderr
    assert not (root / "envs/current").exists()


def test_switch_refuses_while_a_run_holds_run_lock(root):
    _env(root, "cpu-a")
    runlock = root / "locks/run.lock"
    runlock.write_text('{"run_id": "r-42", "pid": 7}\n')
    holder = subprocess.Popen(["flock", str(runlock), "sleep", "300"], start_new_session=True)
    try:
        deadline = time.monotonic() + 60     # until the holder (a process starting) has it
        while subprocess.run(["flock", "-n", str(runlock), "true"]).returncode == 0:
            assert time.monotonic() < deadline, "the holder never took run.lock"
            time.sleep(0.05)
        r = sh(dp.SWITCH_SCRIPT, str(root / "envs"), "cpu-a", "", str(runlock))
        assert r.returncode == dp.EXIT_BUSY
        owner = r.stdout.split("\t", 1)[1].strip()
        assert dp.describe_run_lock(dp.decode_b64(owner)) == "run r-42 (pid 7)"
        assert not (root / "envs/current").exists()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)   # flock and its sleep
        holder.wait()


def test_clean_removes_half_built_envs_only(root):
    half = _env(root, "cpu-half", complete=False)
    (half / "lib").mkdir()
    good = _env(root, "cpu-good")
    (root / "envs" / ".trash.cpu-old.1").mkdir()  # a cleanup cut short earlier
    sh(dp.CLEAN_SCRIPT, str(half), str(good))
    assert not half.exists() and good.exists()
    assert not list((root / "envs").glob(".trash.*"))


def test_state_script_reports_the_root(root):
    env = _env(root, "cpu-a")
    (env / "fingerprint.json").write_text('{"torch": "2.13.0+cpu"}')
    os.symlink("cpu-a", root / "envs/current")
    _env(root, "cpu-half", complete=False)
    (root / "locks/deploy.owner").write_text("tok {}\n")
    r = sh(dp.STATE_SCRIPT, str(root), str(env), "3", str(root / "wheels/x.whl"))
    s = dp.parse_state(r.stdout)
    assert s.complete_output and s.current_name == "cpu-a" and s.target == "complete"
    assert s.current_fingerprint is not None and s.current_fingerprint.torch == "2.13.0+cpu"
    assert s.current_marker == EnvComplete()
    assert s.envs == {"cpu-a": True, "cpu-half": False}
    assert s.uv_version == "" and s.current_freeze is None  # no uv pushed yet
    assert s.python.endswith("python3") and s.df_kb and s.df_kb > 0
    assert not s.wheel_present and s.deploy_owner == "tok {}" and s.deploy_owner_age is not None


def test_state_script_with_an_awkward_root(tmp_path: Path):
    """Spaces, quotes, unicode and shell characters in the root reach the script as "$1"."""
    root = tmp_path / "r 'q' \"dq\" $(x) — ü"
    (root / "envs").mkdir(parents=True)
    (root / "locks").mkdir()
    env = _env(root, "cpu-a")
    os.symlink("cpu-a", root / "envs/current")
    (root / "locks/run.lock").write_text('{"run_id": "r-ü"}')
    probe = dp.state_probe(str(root), str(env), "3", str(root / "wheels/x.whl"))
    p = subprocess.run(list(probe.argv), capture_output=True, timeout=30)
    s = probe.parse_output(p.stdout, p.stderr, p.returncode)
    assert s.complete_output and s.current == "cpu-a" and s.target == "complete"
    assert s.envs == {"cpu-a": True} and s.df_kb and not s.run_lock_held
    assert not (tmp_path / "x").exists()
