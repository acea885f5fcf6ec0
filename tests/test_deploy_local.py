"""`dfo deploy` on the `local` transport (the README's main job runs on the local default):
a real uv env under a temporary root, offline from a wheelhouse, torch's wheel found
through PIP_FIND_LINKS."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.engine.deploy import Deployer, local_find_links
from orchestrator.common.errors import LockHeldError
from orchestrator.config.inventory import HostConfig
from orchestrator.transport import LocalTransport

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DFO = str(Path(sys.executable).with_name("dfo"))


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory, cpu_wheelhouse) -> tuple[Path, Path]:
    """(wheelhouse without torch, a find-links dir holding only torch): the cpu lock's wheels."""
    from tests.helpers.wheelhouse import is_old_pyyaml

    wh, links = tmp_path_factory.mktemp("wheelhouse"), tmp_path_factory.mktemp("links")
    for f in cpu_wheelhouse.glob("*.whl"):
        if not is_old_pyyaml(f):
            os.link(f, (links if f.name.startswith("torch-") else wh) / f.name)
    assert list(links.glob("torch-2.13.0+cpu-*.whl"))
    return wh, links


def test_find_links_from_environment():
    env = {"PIP_FIND_LINKS": "/a /b", "UV_FIND_LINKS": "/c,/a"}
    assert local_find_links(env) == ["/c", "/a", "/b"]
    assert local_find_links({}) == []


def test_local_deploy_noop_and_check(wheelhouse, tmp_path, project_wheel):
    wh, links = wheelhouse
    host = HostConfig(name="local", transport="local", root=str(tmp_path / "root"),
                      wheelhouse=str(wh))
    wheel = project_wheel
    t = LocalTransport("local")
    events = []
    d = Deployer(t, host, wheel=wheel, environ={"PIP_FIND_LINKS": str(links)},
                 on_event=lambda *a: events.append(a))
    r = d.deploy()
    assert r.action == "create", r
    cur = tmp_path / "root/envs/current"
    assert os.readlink(cur) == r.env
    fp = json.loads((cur / "fingerprint.json").read_text())
    assert fp["torch"] == "2.13.0+cpu" and fp["trainer_import"] is True
    assert (cur / ".dfo-complete").is_file()
    started = [e[0] for e in events if e[1] == "start"]
    assert started == ["connect", "push uv", "push wheel", "create venv", "install", "verify",
                       "switch"]
    assert all(s.seconds >= 0 for s in r.stages)

    # without PIP_FIND_LINKS torch is nowhere: a fresh build would fail, but the env is
    # current and matches its lock, so a redeploy is a no-op that never installs
    r2 = Deployer(t, host, wheel=wheel, environ={}).deploy()
    assert r2.action == "noop" and "nothing to do" in r2.message
    assert Deployer(t, host, wheel=wheel, environ={}).check().ok

    # two deploys at once: the second is refused and told who holds the lock
    env = {"PIP_FIND_LINKS": str(links)}
    result: dict = {}

    def first():
        try:
            result["r"] = Deployer(t, host, wheel=wheel, environ=env).deploy(force=True)
        except Exception as e:  # noqa: BLE001
            result["e"] = e

    th = threading.Thread(target=first)
    th.start()
    owner = tmp_path / "root/locks/deploy.owner"
    deadline = time.monotonic() + 120
    while not owner.exists() and th.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(LockHeldError) as ei:
        Deployer(t, host, wheel=wheel, environ=env).deploy(force=True)
    th.join(300)
    assert "r" in result, result.get("e")
    assert result["r"].action == "repair"
    msg = str(ei.value)
    assert f"pid {os.getpid()}" in msg and "locks/deploy.lock on local" in msg, msg
    assert not owner.exists()  # released


def _written(pids: list[int]) -> int:
    """Bytes these processes wrote so far (/proc/PID/io wchar; 0 for one that is gone)."""
    n = 0
    for pid in pids:
        try:
            for ln in Path(f"/proc/{pid}/io").read_text().splitlines():
                if ln.startswith("wchar:"):
                    n += int(ln.split()[1])
        except (OSError, ValueError):
            pass
    return n


def _procs_with(*needles: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if all(n in cmd for n in needles):
            pids.append(int(p.name))
    return pids


def _ctrl_c(p: subprocess.Popen, mid_install, uv_running) -> None:
    """Ctrl-C to a deploying dfo once ``mid_install()`` returned: exit 130, "interrupted"
    and no traceback, and uv stopped with dfo (SIGKILLed with its session: gone once the
    kernel tore it down; a zombie or a process in its exit has no command line)."""
    try:
        mid_install()
        assert p.poll() is None
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "dfo: interrupted" in err and "Traceback" not in err
    deadline = time.monotonic() + 30
    while uv_running():
        assert time.monotonic() < deadline, "uv goes on after dfo was interrupted"
        time.sleep(0.05)


def test_ctrl_c_mid_install_then_next_deploy_finishes(wheelhouse, tmp_path, project_wheel):
    """Ctrl-C while uv installs: exit 130, uv stopped, nothing current, lock released;
    the next deploy removes the half-built env and builds it."""
    wh, links = wheelhouse
    root = tmp_path / "root"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  local:\n    transport: local\n    root: {root}\n"
                     f"    profile: cpu\n    wheelhouse: {wh}\n")
    env = dict(os.environ, PIP_FIND_LINKS=str(links),
               UV_CACHE_DIR=str(tmp_path / "uv-cache"),  # cold: unpacking torch takes seconds
               DFO_PROJECT_WHEEL=str(project_wheel.path))
    env.pop("UV_FIND_LINKS", None)
    p = subprocess.Popen([DFO, "--hosts", str(hosts), "deploy"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    def first_mib() -> None:
        # mid install: uv is syncing and has written its first MiB (it unpacks torch from a
        # cold cache for seconds more), however fast or slow the box gets there
        deadline = time.monotonic() + 300
        while _written(_procs_with("pip sync", str(root))) < 1 << 20:
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)

    _ctrl_c(p, first_mib, lambda: _procs_with("pip sync", str(root)))
    envs = [e for e in (root / "envs").iterdir() if not e.name.startswith(".")]
    assert envs and all(not (e / ".dfo-complete").exists() for e in envs)
    assert not (root / "envs/current").exists()
    assert not (root / "locks/deploy.owner").exists()  # the lease was released

    r = subprocess.run([DFO, "--hosts", str(hosts), "deploy", "--json"], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["action"] == "create"
    assert os.readlink(root / "envs/current") == rep["env"]
    assert (root / "envs" / rep["env"] / ".dfo-complete").is_file()


# --------------------------------------------------------------------------- a deploy that
# fails never breaks the env that works: a repair, update or --force builds a new env
# beside envs/current and switches only once it is verified


def _uv_syncs(root: Path, env_name: str) -> list[int]:
    """The uv ``pip sync`` processes (uv itself, not its wrappers) installing into envs/NAME."""
    uv, into = str(root / "bin/uv"), str(root / "envs" / env_name) + "/"
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if argv[0] == uv and argv[1:3] == ["pip", "sync"] and any(into in a for a in argv):
            pids.append(int(p.name))
    return pids


def _mid_install(p: subprocess.Popen, root: Path, env_name: str) -> list[int]:
    """Wait until uv installs into envs/NAME and has written its first MiB (unpacking torch
    from a cold cache goes on for seconds more); its pids."""
    deadline = time.monotonic() + 300
    while _written(pids := _uv_syncs(root, env_name)) < 1 << 20:
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "uv never installed into " + env_name
        time.sleep(0.05)
    return pids


def _setup(tmp_path: Path, wheelhouse, project_wheel, cache: Path):
    """A local root with the cpu env deployed (current), the CLI's environment, hosts.yaml."""
    wh, links = wheelhouse
    root = tmp_path / "root"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  local:\n    transport: local\n    root: {root}\n"
                     f"    profile: cpu\n    wheelhouse: {wh}\n")
    env = dict(os.environ, PIP_FIND_LINKS=str(links), UV_CACHE_DIR=str(cache),
               DFO_PROJECT_WHEEL=str(project_wheel.path))
    env.pop("UV_FIND_LINKS", None)
    r = subprocess.run([DFO, "--hosts", str(hosts), "deploy", "--json"], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["action"] == "create" and os.readlink(root / "envs/current") == rep["env"]
    return root, hosts, env, rep["env"]


def _current_is_good(root: Path, hosts: Path, name: str, wheel) -> None:
    """envs/current is still NAME, complete, and launch's env check accepts it."""
    from orchestrator.config.inventory import load_inventory
    from orchestrator.plan.launch_facts import FactsRequest, facts_argv, parse_facts

    assert os.readlink(root / "envs/current") == name
    assert (root / "envs" / name / ".dfo-complete").is_file()
    host = load_inventory(str(hosts)).get("local")
    t = LocalTransport("local")
    d = Deployer(t, host, wheel=wheel)
    out = t.run(facts_argv(FactsRequest(root=host.tree.root, run_lock=host.tree.run_lock,
                                        check=True, env_dir=d.local_facts()[2],
                                        python_spec=d.python_spec(), wheel=d.wheel_remote())),
                timeout=600)
    rep, _ = d.launch_check(parse_facts(out.out))
    assert rep.ok and rep.drift == [] and rep.env == name, rep.drift


def _next_deploy_cleans(root: Path, hosts: Path, env: dict, name: str, half: str) -> None:
    r = subprocess.run([DFO, "--hosts", str(hosts), "deploy", "--json"], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["action"] == "noop" and rep["env"] == name, rep
    assert f"removed the half-built {half}" in rep["message"]
    assert not (root / "envs" / half).exists() and not list((root / "envs").glob(".trash.*"))
    assert os.readlink(root / "envs/current") == name


@pytest.fixture(scope="module")
def warm_uv_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("uv-cache")


def test_ctrl_c_during_force_leaves_current_working(wheelhouse, tmp_path, project_wheel,
                                                    warm_uv_cache):
    """Ctrl-C while `deploy --force` installs (uv held still with SIGSTOP, so the interrupt
    lands mid-install): exit 130, envs/current is the old env, complete and launchable;
    the next deploy removes the half-built one."""
    root, hosts, env, name = _setup(tmp_path, wheelhouse, project_wheel, warm_uv_cache)
    half = f"{name}.2"
    cold = dict(env, UV_CACHE_DIR=str(tmp_path / "cold-cache"))  # unpacking torch takes seconds
    p = subprocess.Popen([DFO, "--hosts", str(hosts), "deploy", "--force"], env=cold,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    def held_still() -> None:
        for pid in _mid_install(p, root, half):
            os.kill(pid, signal.SIGSTOP)

    _ctrl_c(p, held_still, lambda: _uv_syncs(root, half))
    assert (root / "envs" / half).is_dir() and not (root / "envs" / half / ".dfo-complete").exists()
    assert not (root / "locks/deploy.owner").exists()  # the lease was released
    _current_is_good(root, hosts, name, project_wheel)
    _next_deploy_cleans(root, hosts, env, name, half)


def test_failed_force_leaves_current_working(wheelhouse, tmp_path, project_wheel,
                                             warm_uv_cache):
    """`deploy --force` failing mid-way (a wheelhouse without a wheel the lock needs; uv
    killed with SIGKILL): one-line error, envs/current untouched and launchable, the
    half-built env removed by the next deploy; a forced deploy that completes switches to a
    new generation and keeps no more than current and previous."""
    root, hosts, env, name = _setup(tmp_path, wheelhouse, project_wheel, warm_uv_cache)
    wh, _ = wheelhouse
    half = f"{name}.2"

    # 1. the wheelhouse lacks a wheel the lock pins
    short = tmp_path / "short-wheelhouse"
    short.mkdir()
    gone = next(f for f in sorted(wh.glob("mdurl-*.whl")))
    for f in wh.glob("*.whl"):
        if f != gone:
            os.link(f, short / f.name)
    good_hosts = hosts.read_text()
    hosts.write_text(good_hosts.replace(f"wheelhouse: {wh}", f"wheelhouse: {short}"))
    cold = dict(env, UV_CACHE_DIR=str(tmp_path / "cold-1"))
    r = subprocess.run([DFO, "--hosts", str(hosts), "deploy", "--force"], env=cold,
                       capture_output=True, text=True, timeout=900)
    hosts.write_text(good_hosts)
    assert r.returncode == 7, r.stdout + r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("dfo: error:")]
    assert len(err) == 1 and "mdurl" in err[0] and "not available" in err[0], r.stderr
    assert "envs/current is untouched" in err[0] and "Traceback" not in r.stderr
    _current_is_good(root, hosts, name, project_wheel)
    _next_deploy_cleans(root, hosts, env, name, half)

    # 2. uv killed mid-install
    cold = dict(env, UV_CACHE_DIR=str(tmp_path / "cold-2"))
    p = subprocess.Popen([DFO, "--hosts", str(hosts), "deploy", "--force"], env=cold,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for pid in _mid_install(p, root, half):
            os.kill(pid, signal.SIGKILL)
        out, err2 = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 7, out + err2
    assert "envs/current is untouched" in err2 and "Traceback" not in err2
    assert (root / "envs" / half).is_dir() and not (root / "envs" / half / ".dfo-complete").exists()
    _current_is_good(root, hosts, name, project_wheel)
    _next_deploy_cleans(root, hosts, env, name, half)

    # a forced deploy that completes: a new generation, the old env kept as previous; the
    # next one retires the oldest (never more than current + previous of one env)
    for n, prev in ((2, name), (3, f"{name}.2")):
        r = subprocess.run([DFO, "--hosts", str(hosts), "deploy", "--force", "--json"], env=env,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["action"] == "repair" and rep["env"] == f"{name}.{n}", rep
        assert os.readlink(root / "envs/previous") == prev
        _current_is_good(root, hosts, f"{name}.{n}", project_wheel)
    assert sorted(e.name for e in (root / "envs").iterdir()) == sorted(
        ["current", "previous", f"{name}.2", f"{name}.3"])


def _cache_bytes(d: Path) -> int:
    """Bytes of the files under ``d``, each inode once (uv hardlinks)."""
    seen, total = set(), 0
    for dirpath, _, files in os.walk(d):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total


def test_force_builds_the_next_generation_from_the_uv_cache(wheelhouse, tmp_path, project_wheel):
    """docs/deploy.md: a second env of the same packages takes seconds and little disk. The
    new generation is a venv made just now: uv fills it from its cache, without
    ``--reinstall`` (which implies ``--refresh``: every package fetched again from the
    index). The host's uv is wrapped by a script that records each command line and runs
    the real uv."""
    cache = tmp_path / "uv-cache"
    root, hosts, env, name = _setup(tmp_path, wheelhouse, project_wheel, cache)
    uv = root / "bin" / "uv"
    real = root / "bin" / "uv.real"
    os.rename(uv, real)
    calls = tmp_path / "uv-calls"
    uv.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\nexec {real} "$@"\n')
    uv.chmod(0o755)
    before = _cache_bytes(cache)
    r = subprocess.run([DFO, "--hosts", str(hosts), "deploy", "--force", "--json"], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["action"] == "repair" and rep["env"] == f"{name}.2", rep
    syncs = [ln for ln in calls.read_text().splitlines() if ln.startswith("pip sync ")]
    assert len(syncs) == 1 and f"envs/{name}.2/" in syncs[0], syncs
    assert "--reinstall" not in syncs[0].split() and "--refresh" not in syncs[0].split()
    grown = _cache_bytes(cache) - before
    assert before > 100 << 20 and grown < before // 20, (before, grown)
    # the new generation's files are the cache's, as the first env's are: one inode each
    site = "lib/python3.11/site-packages/torch/__init__.py"
    first, second = (os.stat(root / "envs" / n / site) for n in (name, f"{name}.2"))
    assert first.st_ino == second.st_ino, "the new generation was unpacked again"
    _current_is_good(root, hosts, f"{name}.2", project_wheel)
