"""`dfo deploy` against the real lab: sshd "Proxmox node" + LXC container 200 (no network)
+ real uv, offline from the wheelhouse bind-mounted at /mnt/wheelhouse.

The CPU env (torch ~200 MB) is installed once per session (``deployed``) and shared;
the tests run in file order and each leaves envs/current on the session's cpu env
(``Deployed.env_name``: a repair makes a new generation of it, which it then names).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from orchestrator.engine.deploy import Deployer
from orchestrator.common.errors import DeployError, VerifyError
from orchestrator.config.inventory import HostConfig, load_inventory
from orchestrator.plan.fingerprint import FINGERPRINT_FIELDS
from orchestrator.config.host_tree import env_generation
from orchestrator.config.lockfile import lock_hash
from orchestrator.config.profiles import PROFILES_DIR
from orchestrator.engine.wheel import ProjectWheel
from orchestrator.transport import Transport, open_transport
from tests.helpers.wheelhouse import OLD_PYYAML

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

ROOT = "/root/dfo-deploy-test"
DFO = str(Path(sys.executable).with_name("dfo"))


@dataclass
class Deployed:
    hosts: Path
    host: HostConfig
    t: Transport
    wheel: ProjectWheel
    env_name: str
    report: object
    profiles: Path  # a dir for test-made profiles


def copy_profile(dest_parent: Path, name: str, *, expect: dict | None = None, **top) -> Path:
    """A copy of the cpu profile under another name, with changed fields."""
    d = dest_parent / name
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(PROFILES_DIR / "cpu", d)
    doc = yaml.safe_load((d / "profile.yaml").read_text())
    doc["name"] = name
    if expect:
        doc["expect"].update(expect)
    doc.update(top)
    (d / "profile.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return d


def cli(d: Deployed, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, DFO_PROJECT_WHEEL=str(d.wheel.path))
    return subprocess.run([DFO, "--hosts", str(d.hosts), "deploy", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def rsh(d: Deployed, script: str, *args: str, timeout: float = 60) -> str:
    r = d.t.run(["bash", "-c", script, "x", *args], timeout=timeout)
    return r.out


def current(d: Deployed) -> str:
    return rsh(d, 'readlink "$1" || true', f"{ROOT}/envs/current").strip()


def lock12(d: Deployed) -> str:
    """The cpu lock's 12 hex digits in its env's name (the same in every generation)."""
    return env_generation(d.env_name)[0].rsplit("-", 1)[1]


def complete(d: Deployed, name: str) -> bool:
    return rsh(d, '[ -f "$1" ] && echo yes || echo no', f"{ROOT}/envs/{name}/.dfo-complete").strip() == "yes"


@pytest.fixture(scope="session")
def deployed(lab, lab_wheelhouse, project_wheel, tmp_path_factory) -> Deployed:
    base = tmp_path_factory.mktemp("deploy-lab")
    hosts = base / "hosts.yaml"
    hosts.write_text(lab.hosts_yaml(root=ROOT, wheelhouse=True))
    host = load_inventory(str(hosts)).get("lab")
    assert host.wheelhouse == "/mnt/wheelhouse"
    wheel = project_wheel
    t = open_transport(host)
    t.run(["rm", "-rf", ROOT], timeout=120, check=True)
    report = Deployer(t, host, wheel=wheel).deploy()
    profiles = base / "profiles"
    profiles.mkdir()
    yield Deployed(hosts, host, t, wheel, report.env, report, profiles)
    t.run(["rm", "-rf", ROOT], timeout=300)  # ~1 GB of envs + uv cache in the shared container
    t.close()


def test_offline_deploy_records_fingerprint(deployed):
    d = deployed
    r = d.report
    assert r.action == "create" and current(d) == r.env == d.env_name
    assert {s.stage: s.status for s in r.stages} == {
        "connect": "done", "push uv": "done", "push wheel": "done", "create venv": "done",
        "install": "done", "verify": "done", "switch": "done"}
    fp = json.loads(d.t.get(f"{ROOT}/envs/current/fingerprint.json"))
    assert list(fp)[:len(FINGERPRINT_FIELDS)] == list(FINGERPRINT_FIELDS)
    assert fp["profile"] == "cpu" and fp["lock_hash"] == lock_hash(
        (PROFILES_DIR / "cpu/requirements.lock").read_bytes())
    assert fp["torch"] == "2.13.0+cpu" and fp["torch_cuda"] is None and fp["python"].startswith("3.11")
    assert fp["transformers"] == "5.24.0" and fp["trainer_import"] is True and fp["dfo"] == "0.1.0"
    # the container has no network: everything came from /mnt/wheelhouse
    assert rsh(d, "cat /proc/net/route | wc -l").strip() in ("0", "1")
    # dfo's own wheel is what runs in there
    out = d.t.run([f"{ROOT}/envs/current/bin/python", "-c",
                   "import orchestrator, trainer, sys; print(orchestrator.__file__)"], timeout=60)
    assert out.ok and "/envs/" in out.out
    # uv's cache lives under the root on a remote target
    assert rsh(d, 'ls "$1" | head -n1', f"{ROOT}/uv-cache").strip()
    uv = d.t.run([f"{ROOT}/bin/uv", "--version"], timeout=30).out
    import uv as uvpkg

    local = subprocess.run([uvpkg.find_uv_bin(), "--version"], capture_output=True, text=True).stdout
    assert uv.split()[1] == local.split()[1]


def test_second_deploy_is_a_noop(deployed):
    d = deployed
    r = cli(d, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["action"] == "noop" and rep["env"] == d.env_name
    assert [s["stage"] for s in rep["stages"] if s["status"] == "done"] == ["connect"]
    assert "nothing to do" in rep["message"]


def test_drift_is_reported_and_repaired(deployed):
    d = deployed
    py = f"{ROOT}/envs/current/bin/python"
    d.t.run([f"{ROOT}/bin/uv", "pip", "install", "--python", py, "--no-index", "--offline",
             "--find-links", "/mnt/wheelhouse", f"pyyaml=={OLD_PYYAML}"], timeout=300, check=True)
    r = cli(d, "--check")
    assert r.returncode == 7, r.stdout + r.stderr
    assert f"pyyaml: lock 6.0.4, installed {OLD_PYYAML}" in r.stdout
    assert "dfo: error:" in r.stderr and "run `dfo deploy` to repair it" in r.stderr
    assert len(r.stderr.strip().splitlines()) >= 1 and "Traceback" not in r.stderr

    r = cli(d, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["action"] == "repair" and rep["drift"] == [f"pyyaml: lock 6.0.4, installed {OLD_PYYAML}"]
    # the repair built a new generation beside the drifted env and switched to it; the
    # drifted env was never changed and is envs/previous
    assert rep["env"] == f"{d.env_name}.2"
    assert rsh(d, 'readlink "$1"', f"{ROOT}/envs/previous").strip() == d.env_name
    assert complete(d, d.env_name)
    d.env_name = rep["env"]  # the session's cpu env from here on
    r = cli(d, "--check", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["drift"] == []
    assert current(d) == d.env_name and complete(d, d.env_name)


def test_failed_verification_leaves_current_alone(deployed):
    d = deployed
    prof = copy_profile(d.profiles, "cpu-badexpect", expect={"torch_cuda": "12.8"})
    with pytest.raises(VerifyError) as ei:
        Deployer(d.t, d.host, profile=str(prof), wheel=d.wheel).deploy()
    msg = str(ei.value)
    assert "torch.version.cuda: expected 12.8, got none" in msg and "\n" not in msg
    assert current(d) == d.env_name
    bad = f"cpu-badexpect-{lock12(d)}"
    assert not complete(d, bad)  # never marked good: the next deploy removes it


def test_rollback(deployed):
    d = deployed
    alt = copy_profile(d.profiles, "cpu-alt")
    r = Deployer(d.t, d.host, profile=str(alt), wheel=d.wheel).deploy()
    assert r.action == "create" and current(d) == r.env != d.env_name
    res = cli(d, "--rollback", "--json")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert rep["action"] == "rollback" and rep["env"] == d.env_name
    assert {s["stage"]: s["status"] for s in rep["stages"]}["verify"] == "done"
    assert current(d) == d.env_name
    assert rsh(d, 'readlink "$1"', f"{ROOT}/envs/previous").strip() == r.env
    # and forward again: a complete env that is not current is re-synced and switched to
    r2 = Deployer(d.t, d.host, profile=str(alt), wheel=d.wheel).deploy()
    assert r2.action == "reuse" and current(d) == r.env
    assert cli(d, "--rollback").returncode == 0 and current(d) == d.env_name


def test_deploy_refused_while_a_run_holds_run_lock(deployed):
    d = deployed
    runlock = f"{ROOT}/locks/run.lock"
    pid = rsh(d, 'printf "%s\\n" "$2" > "$1"; setsid flock "$1" sleep 120 </dev/null >/dev/null 2>&1 & echo $!',
              runlock, '{"run_id": "r-deploy-test", "pid": 1}').strip()
    try:
        deadline = time.monotonic() + 60      # until the holder (a process starting) has it
        while rsh(d, 'flock -n "$1" true && echo free || echo held', runlock).strip() != "held":
            assert time.monotonic() < deadline, "the holder never took run.lock"
            time.sleep(0.1)
        r = cli(d, "--force")
        assert r.returncode == 9, r.stdout + r.stderr
        assert "run r-deploy-test" in r.stderr and "holds" in r.stderr
        assert current(d) == d.env_name and complete(d, d.env_name)
        assert cli(d).returncode == 0  # a no-op changes nothing: allowed
    finally:
        # setsid made the holder a session (and group) leader: stop flock and its sleep
        rsh(d, 'kill -- -"$1" 2>/dev/null; true', pid)


def _uv_sync_written(d: Deployed) -> int | None:
    """Bytes uv's ``pip sync`` processes wrote so far (/proc/PID/io wchar); None: none runs."""
    out = rsh(d, 'for p in /proc/[0-9]*; do c=$(tr "\\0" " " < $p/cmdline 2>/dev/null); '
                 'w=$(sed -n "s/^wchar: //p" $p/io 2>/dev/null); printf "%s\\t%s\\n" "${w:-0}" "$c"; done')
    # a command line may hold newlines (a ``python -c`` script that names uv): only whole
    # records whose program is uv count
    recs = [ln.split("\t", 1) for ln in out.splitlines() if "\t" in ln]
    sync = [w for w, c in recs if c.split()[:1] and c.split()[0].endswith("/bin/uv")
            and "pip sync" in c]
    return sum(int(w) for w in sync if w.isdigit()) if sync else None


def test_killed_mid_install_next_deploy_recovers(deployed):
    d = deployed
    prof = copy_profile(d.profiles, "cpu-crash")
    # a cold uv cache makes the install take seconds (unpacking torch), long enough to kill it
    rsh(d, 'rm -rf "$1"', f"{ROOT}/uv-cache", timeout=120)
    env = dict(os.environ, DFO_PROJECT_WHEEL=str(d.wheel.path))
    p = subprocess.Popen([DFO, "--hosts", str(d.hosts), "deploy", "--profile", str(prof)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        # mid install: uv syncs and has written its first MiB (unpacking torch from the cold
        # cache goes on for seconds more), however fast or slow the box gets there
        deadline = time.monotonic() + 300
        while (_uv_sync_written(d) or 0) < 1 << 20:
            assert p.poll() is None, "deploy ended before uv sync could be seen"
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert p.poll() is None
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    crash = f"cpu-crash-{lock12(d)}"
    assert current(d) == d.env_name  # never switched to the half-built env
    assert not complete(d, crash)
    r = cli(d, "--profile", str(prof), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["action"] == "create" and rep["env"] == crash
    assert current(d) == crash and complete(d, crash)
    # back to the session's env
    assert Deployer(d.t, d.host, wheel=d.wheel).deploy().action == "reuse"
    assert current(d) == d.env_name


@pytest.mark.parametrize("case", ["python", "disk", "unknown"])
def test_bad_input_is_one_line_and_current_untouched(deployed, case):
    d = deployed
    if case == "python":
        prof = copy_profile(d.profiles, "cpu-py", python="3.99")
        args, code, needle = ["--profile", str(prof)], 7, "python 3.99 not found on lab"
    elif case == "disk":
        prof = copy_profile(d.profiles, "cpu-disk", min_free_mb=10 ** 9)
        args, code, needle = ["--profile", str(prof)], 7, "disk full on lab"
    else:
        args, code, needle = ["--profile", "cpuu"], 2, "unknown profile 'cpuu' (did you mean cpu?"
    r = cli(d, *args)
    assert r.returncode == code, r.stdout + r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("dfo: error:")]
    assert len(err) == 1 and needle in err[0] and "Traceback" not in r.stderr
    assert current(d) == d.env_name


def test_wheel_not_matching_lock_hash_fails_cleanly(deployed):
    d = deployed
    prof = copy_profile(d.profiles, "cpu-badhash")
    lock = prof / "requirements.lock"
    lines = lock.read_text().splitlines(keepends=True)
    i = next(n for n, ln in enumerate(lines) if ln.startswith("mdurl=="))
    j = i + 1
    while lines[j].lstrip().startswith("--hash="):
        lines[j] = "    --hash=sha256:" + "0" * 64 + (" \\\n" if lines[j].rstrip().endswith("\\") else "\n")
        j += 1
    lock.write_text("".join(lines))
    doc = yaml.safe_load((prof / "profile.yaml").read_text())
    doc["lock_sha256"] = lock_hash(lock.read_bytes())  # a consistent lock that pins a wrong hash
    (prof / "profile.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(DeployError) as ei:
        Deployer(d.t, d.host, profile=str(prof), wheel=d.wheel).deploy()
    assert "mdurl" in str(ei.value) and "sha256" in str(ei.value), str(ei.value)
    assert current(d) == d.env_name
