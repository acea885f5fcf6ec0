"""`dfo launch`'s env check from its one round trip, against a real uv env on the local
transport: the env probe runs once, its passed answer is recorded (``.dfo-verified``) and
later launches use it while the env is unchanged; a change to the env after that (a torch
build swapped in, a package added beside the lock, a directory changed inside a package)
makes launch verify again and refuse with exit 7 when the env no longer matches; bytecode
that Python writes while the env is used does not.

The env: ``uv venv`` + dfo's wheel + a one-package lock, installed offline from files made
here; torch, transformers and trainer's dependencies come from this interpreter's
site-packages through a ``.pth`` file (the probe still imports them for real)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config.inventory import HostConfig
from orchestrator.engine.deploy import Deployer
from orchestrator.engine.wheel import build as build_wheel
from orchestrator.plan.fingerprint import build_fingerprint
from orchestrator.plan.launch_facts import VERIFIED_FILE, FactsRequest, facts_argv, parse_facts
from orchestrator.config.lockfile import lock_hash
from orchestrator.transport import LocalTransport

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

uv_mod = pytest.importorskip("uv")


def _wheel(path: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {**files, f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rec = "".join(f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}\n"
                  for k, v in files.items()) + f"{dist}/RECORD,,\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr(f"{dist}/RECORD", rec)
    return path


@pytest.fixture
def env(tmp_path, monkeypatch, project_wheel):
    """(transport, host, hosts.yaml, the env's site-packages) of a deployed, verified env."""
    monkeypatch.setenv("DFO_CACHE_DIR", str(tmp_path / "dfo-cache"))
    # the env probe (a torch import) may take longer than the CLI's 5 s progress beat on a
    # loaded machine: no "still working" line between the one-line errors checked below
    monkeypatch.setenv("DFO_PROGRESS_EVERY", "3600")
    monkeypatch.delenv("DFO_PROJECT_WHEEL", raising=False)
    uv = uv_mod.find_uv_bin()
    uvenv = dict(os.environ, UV_CACHE_DIR=str(tmp_path / "uv-cache"), UV_OFFLINE="1",
                 UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never")
    links = tmp_path / "links"
    _wheel(links / "dfo_probe_pkg-1.0-py3-none-any.whl", "dfo-probe-pkg", "1.0",
           {"dfo_probe_pkg/__init__.py": b""})
    prof = tmp_path / "profile"
    prof.mkdir()
    lock = f"dfo-probe-pkg==1.0 --hash=sha256:{'0' * 64}\n".encode()
    (prof / "requirements.lock").write_bytes(lock)
    root = tmp_path / "root"
    host = HostConfig(name="local", transport="local", root=str(root), profile=str(prof))
    t = LocalTransport("local")
    (prof / "profile.yaml").write_text(yaml.safe_dump({
        "name": "t", "python": "3.11", "lock": "requirements.lock",
        "sources": {"index_url": "https://pypi.org/simple", "find_links": []},
        "expect": {"trainer_import": True}}))
    # the same wheel all through, even if the checkout changes while the test runs
    monkeypatch.setenv("DFO_PROJECT_WHEEL", str(project_wheel.path))
    wheel = build_wheel()
    env_dir = Path(Deployer(t, host).tree.env_dir("t", lock_hash(lock)))
    remote_wheel = Path(Deployer(t, host, wheel=wheel).wheel_remote())
    remote_wheel.parent.mkdir(parents=True)
    shutil.copy(wheel.path, remote_wheel)
    (root / "bin").mkdir()
    os.symlink(uv, root / "bin" / "uv")
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(env_dir)], env=uvenv,
                   check=True, capture_output=True, timeout=300)
    py = str(env_dir / "bin" / "python")
    subprocess.run([uv, "pip", "install", "-q", "--no-deps", "--python", py, str(remote_wheel)],
                   env=uvenv, check=True, capture_output=True, timeout=300)
    subprocess.run([uv, "pip", "install", "-q", "--no-deps", "--no-index", "--find-links",
                    str(links), "--python", py, "dfo-probe-pkg==1.0"], env=uvenv, check=True,
                   capture_output=True, timeout=300)
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # torch, transformers... from this interpreter (after the env's own packages)
    (site / "zz_outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    os.symlink(env_dir.name, root / "envs" / "current")
    d = Deployer(t, host, wheel=wheel)
    probe = d.probe.env(str(env_dir))
    assert probe.trainer_import is True, probe
    d.probe.mark_complete(str(env_dir), build_fingerprint(probe, profile="t", lock_hash=lock_hash(lock)),
                     lock_hash(lock))
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"default": "local", "hosts": {"local": {
        "transport": "local", "root": str(root), "profile": str(prof)}}}))
    return t, host, hosts, site


def launch_check(t, host):
    """launch's env check from its one round trip; the record it returns is written as a
    launch writes it (with the run's files)."""
    d = Deployer(t, host)
    out = t.run(facts_argv(FactsRequest(root=host.tree.root, run_lock=host.tree.run_lock,
                                        check=True, env_dir=d.local_facts()[2],
                                        python_spec=d.python_spec(), wheel=d.wheel_remote())),
                timeout=300)
    rep, record = d.launch_check(parse_facts(out.out))
    if record is not None:
        t.put(record[1], record[0])
    return rep


def dry_launch(hosts, cfg, capsys):
    rc = main(["--hosts", str(hosts), "launch", "--config", str(cfg), "--dry-run"])
    return rc, capsys.readouterr().err


def test_recorded_verification_is_used_until_the_env_changes(env, tmp_path, capsys):
    t, host, hosts, site = env
    cur = Path(host.tree.current_env)
    rep = launch_check(t, host)
    assert rep.ok and not rep.cached, rep.drift          # nothing recorded yet: probed
    assert (cur / VERIFIED_FILE).is_file()
    rep = launch_check(t, host)
    assert rep.ok and rep.cached, rep.drift               # the record holds: no probe

    # Python writing bytecode while the env is used is no change
    (site / "trainer" / "__pycache__").mkdir(exist_ok=True)
    (site / "trainer" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"pyc")
    assert launch_check(t, host).cached

    # a directory added inside an installed package: verify again
    (site / "trainer" / "added_later").mkdir()
    rep = launch_check(t, host)
    assert rep.ok and not rep.cached
    assert launch_check(t, host).cached                   # and the new answer is recorded

    # a file of a package edited in place (same name, no directory change): verify again
    with open(site / "dfo_probe_pkg" / "__init__.py", "a") as fh:
        fh.write("# edited\n")
    rep = launch_check(t, host)
    assert rep.ok and not rep.cached
    assert launch_check(t, host).cached

    # another torch build appears in the env after its verification (an unrelated install)
    # (a bare package dir: `uv pip freeze` does not list it; only the probe sees it)
    fake = site / "torch"
    (fake / "cuda").mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "__version__ = '2.11.0+cu130'\nfrom . import version, cuda\n")
    (fake / "version.py").write_text("git_version = 'x'\ncuda = '13.0'\n")
    (fake / "cuda" / "__init__.py").write_text(
        "def is_available():\n    return False\ndef device_count():\n    return 0\n")
    rep = launch_check(t, host)
    assert not rep.ok and not rep.cached
    assert any("torch" in x and "2.11.0+cu130" in x for x in rep.drift), rep.drift
    assert not launch_check(t, host).cached               # a failed check is never recorded

    cfg = tmp_path / "c.yaml"
    base = yaml.safe_load((Path(__file__).resolve().parents[1] / "orchestrator" / "config" /
                           "defaults" / "tiny-cpu.yaml").read_text())
    (tmp_path / "target").mkdir()
    (tmp_path / "data.jsonl").write_text("")
    base["model"]["target_path"] = str(tmp_path / "target")
    base["data"]["path"] = str(tmp_path / "data.jsonl")
    base.pop("run", None)
    cfg.write_text(yaml.safe_dump(base))
    rc, err = dry_launch(hosts, cfg, capsys)
    assert rc == 7 and "differs from its lock" in err and "torch" in err, err
    assert err.count("\n") == 1, err

    # swapped back: passes; a dry run records nothing (it writes nothing at all), a
    # launch's check records what it verified
    shutil.rmtree(fake)
    before = (cur / VERIFIED_FILE).read_bytes()
    rc, err = dry_launch(hosts, cfg, capsys)
    assert rc == 0, err
    assert (cur / VERIFIED_FILE).read_bytes() == before
    assert launch_check(t, host).ok
    assert launch_check(t, host).cached

    # a package installed beside the lock (dist-info: the stamp changes; freeze lists it)
    dist = site / "extra_pkg-2.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: extra-pkg\nVersion: 2.0\n")
    (dist / "RECORD").write_text("")
    rep = launch_check(t, host)
    assert not rep.ok and not rep.cached and any("extra-pkg" in x for x in rep.drift), rep.drift


def test_the_record_of_another_env_state_is_not_used(env):
    """A record whose stamp is not the env's (copied from elsewhere, or hand-written) is
    ignored: launch probes."""
    t, host, _, _ = env
    cur = Path(host.tree.current_env)
    assert launch_check(t, host).ok
    text = (cur / VERIFIED_FILE).read_text().splitlines()
    stamp, at = text[0].split()
    (cur / VERIFIED_FILE).write_text(f"{'0' * 64} {at}\n{text[1]}\n")
    assert not launch_check(t, host).cached
    assert launch_check(t, host).cached
    rec = json.loads((cur / VERIFIED_FILE).read_text().splitlines()[1])
    assert rec["probe"]["trainer_import"] is True and "dfo-probe-pkg==1.0" in rec["freeze"]
