"""Two installs of dfo on one host (a tool-installed one and a checkout's): each deploy puts
its own wheel into the env; a launch from the other dfo switches its wheel back in (kept on
the host by hash) instead of failing, and says in one line what differs and what fixes it
when it cannot. Real uv, real wheels built from the checkout at two versions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.inventory import HostConfig
from orchestrator.engine.deploy import Deployer
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.engine.wheel import _source_files, from_file, source_root
from orchestrator.common.errors import DriftError
from orchestrator.transport import LocalTransport
from tests.supervisor_env import FAST, wait_final
from tests.test_deploy_local import wheelhouse  # noqa: F401  (the cpu lock's wheels)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def build_at_version(dest: Path, version: str) -> Path:
    """dfo's wheel built from a copy of the checkout whose version is ``version``."""
    root = source_root()
    src = dest / "src"
    for f in _source_files(root):
        out = src / f.relative_to(root)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, out)
    for rel, old, new in (("pyproject.toml", 'version = "0.1.0"', f'version = "{version}"'),
                          ("orchestrator/__init__.py", '__version__ = "0.1.0"',
                           f'__version__ = "{version}"')):
        p = src / rel
        text = p.read_text()
        assert old in text, rel
        p.write_text(text.replace(old, new, 1))
    uv = str(Path(sys.executable).with_name("uv"))
    subprocess.run([uv, "build", "--wheel", "--no-build-isolation", "--python", sys.executable,
                    "--quiet", "--out-dir", str(dest / "dist"), str(src)], check=True)
    return next((dest / "dist").glob(f"dfo-{version}-*.whl"))


def freeze_dfo(root: Path) -> str:
    py = root / "envs" / "current" / "bin" / "python"
    uv = str(Path(sys.executable).with_name("uv"))
    out = subprocess.run([uv, "pip", "freeze", "--python", str(py)], capture_output=True,
                         text=True, check=True).stdout
    return next(ln for ln in out.splitlines() if ln.startswith("dfo"))


def test_the_env_probe_answers_for_the_env_not_the_working_directory(tmp_path, monkeypatch):
    from importlib.metadata import version

    from orchestrator.plan.fingerprint import parse_probe, probe_argv

    other = tmp_path / "checkout"
    (other / "dfo-9.9.9.dist-info").mkdir(parents=True)
    (other / "dfo-9.9.9.dist-info" / "METADATA").write_text("Name: dfo\nVersion: 9.9.9\n")
    monkeypatch.chdir(other)
    p = subprocess.run(probe_argv(sys.executable), capture_output=True, text=True, timeout=600)
    assert parse_probe(p.stdout + "\n" + p.stderr).dfo == version("dfo") != "9.9.9"


def test_two_dfos_share_one_host(wheelhouse, tmp_path, monkeypatch):  # noqa: F811
    wh, links = wheelhouse
    monkeypatch.chdir(tmp_path)   # not the checkout: `python -m` would import its modules
    a = from_file(build_at_version(tmp_path / "a", "0.1.0"))
    b = from_file(build_at_version(tmp_path / "b", "0.1.1"))
    root = tmp_path / "root"
    host = HostConfig(name="local", transport="local", root=str(root), wheelhouse=str(wh))
    t = LocalTransport("local")
    env = {"PIP_FIND_LINKS": str(links)}
    Deployer(t, host, wheel=a, environ=env).deploy()
    assert "dfo-0.1.0-" in freeze_dfo(root)
    Deployer(t, host, wheel=b, environ=env).deploy()       # the other dfo deploys its wheel
    assert "dfo-0.1.1-" in freeze_dfo(root)
    envs_before = sorted(p.name for p in (root / "envs").iterdir())

    run_ops = RunOps(t, host)
    cmd = [sys.executable, "-c", "print('step 1 loss 0 tok/s 1')"]

    def launch(**kw):
        return run_ops.launch(LaunchOptions(command=cmd, run_name="two", backoff_scale=0.01,
                                        thresholds=dict(FAST), env_check=True, **kw))

    # dfo A launches: its wheel is on the host from its deploy: switched in, no redeploy
    monkeypatch.setenv("DFO_PROJECT_WHEEL", str(a.path))
    plan = launch()
    assert wait_final(run_ops, plan.run_id, timeout=300)["status"] == "done"
    assert "dfo-0.1.0-" in freeze_dfo(root)
    assert sorted(p.name for p in (root / "envs").iterdir()) == envs_before
    assert Deployer(t, host, wheel=a, environ=env).check().ok

    # dfo B, dry run: says what a launch would do and changes nothing
    monkeypatch.setenv("DFO_PROJECT_WHEEL", str(b.path))
    launch(dry_run=True)
    assert "dfo-0.1.0-" in freeze_dfo(root)

    # dfo B's wheel gone from the host: one line, dfo's own version, the command that fixes it
    shutil.rmtree(root / "wheels" / b.short)
    with pytest.raises(DriftError) as ei:
        launch()
    msg = str(ei.value)
    assert "\n" not in msg and "another dfo's wheel (dfo-0.1.0-" in msg
    assert "only dfo's own version differs" in msg and "dfo deploy --host local" in msg
    assert os.path.basename(b.filename) in msg
