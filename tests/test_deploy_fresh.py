"""A fresh machine's first `dfo deploy`, with real uv and nothing of this machine's own:
an empty HOME and uv cache, and no find-links variables but those a test sets. The
embedded `local` default (the README's main job) deploys from PyPI alone; the small `cpu`
profile, whose torch PyPI does not serve, stops with one line that names the pin and
the fixes, or deploys from `--find-links`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

DFO = str(Path(sys.executable).with_name("dfo"))
FIND_LINKS_VARS = ("PIP_FIND_LINKS", "UV_FIND_LINKS", "UV_OFFLINE", "UV_INDEX_URL",
                   "UV_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "DFO_HOSTS")


def fresh_env(tmp_path: Path, project_wheel, **extra: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in FIND_LINKS_VARS}
    env.update(HOME=str(home), UV_CACHE_DIR=str(tmp_path / "uv-cache"),
               DFO_CACHE_DIR=str(tmp_path / "dfo-cache"),
               # pin dfo's wheel: the checkout may change during the run
               DFO_PROJECT_WHEEL=str(project_wheel.path), **extra)
    return env


@pytest.fixture(scope="module")
def torch_links(tmp_path_factory, cpu_wheelhouse) -> Path:
    """A find-links dir holding only torch's +cpu wheel (as PIP_FIND_LINKS on this kind of
    machine does): it must not stand in for PyPI's build of the same version."""
    d = tmp_path_factory.mktemp("torch-links")
    for f in cpu_wheelhouse.glob("torch-2.13.0+cpu-*.whl"):
        os.link(f, d / f.name)
    assert list(d.iterdir())
    return d


def needs_free_disk(path: Path, profile: str) -> None:
    """Skip, naming both figures, when ``path``'s filesystem has less room than the profile's
    ``min_free_mb`` (dfo's own deploy check would refuse: README, "Run the tests")."""
    from orchestrator.config.profiles import load_profile

    need = load_profile(profile).min_free_mb
    free = shutil.disk_usage(path).free >> 20
    if free < need:
        pytest.skip(f"needs {need} MB free for the {profile} env, {path} has {free} MB")


def test_the_embedded_default_deploys_from_pypi_alone(tmp_path, project_wheel, torch_links):
    needs_free_disk(tmp_path, "cpu-pypi")
    env = fresh_env(tmp_path, project_wheel, PIP_FIND_LINKS=str(torch_links))
    r = subprocess.run([DFO, "deploy", "--json"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=1100)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["host"] == "local" and rep["action"] == "create"
    assert rep["env"].startswith("cpu-pypi-"), rep
    fp = rep["fingerprint"]
    assert fp["torch"] == "2.13.0+cu130" and fp["torch_cuda"] == "13.0", fp
    home = Path(env["HOME"])
    assert os.readlink(home / ".dfo/envs/current") == rep["env"]
    r = subprocess.run([DFO, "deploy"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stdout + r.stderr
    # a plain `dfo deploy --force` after it: the same sources, a new generation
    r = subprocess.run([DFO, "deploy", "--force", "--json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["env"] == rep["env"] + ".2"


def test_a_pin_the_sources_cannot_serve_is_one_line(tmp_path, project_wheel):
    env = fresh_env(tmp_path, project_wheel)
    r = subprocess.run([DFO, "deploy", "--profile", "cpu"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 7, r.stdout + r.stderr
    # the stage lines (a pipe gets timestamped ones), then the error: one line, the last
    err = r.stderr.strip().splitlines()
    assert [ln for ln in err if "error" in ln.lower()][-1] == err[-1], r.stderr
    assert sum(ln.startswith("dfo: error:") for ln in err) == 1 and "Traceback" not in r.stderr
    line = err[-1]
    assert line.startswith("dfo: error: torch==2.13.0+cpu is not served by the package sources "
                           "on local (PyPI)"), line
    for fix in ("wheelhouse:", "--find-links", "https://download.pytorch.org/whl/cpu/torch/",
                "--profile cpu-pypi", "envs/current is untouched"):
        assert fix in line, (fix, line)
    assert not (Path(env["HOME"]) / ".dfo/envs/current").exists()


def test_find_links_serves_the_pin(tmp_path, project_wheel, torch_links, cpu_wheelhouse):
    """`--find-links DIR` gives uv the +cpu wheel; the rest comes from a dir without torch,
    offline."""
    from tests.helpers.wheelhouse import is_old_pyyaml

    rest = tmp_path / "rest"
    rest.mkdir()
    for f in cpu_wheelhouse.glob("*.whl"):
        if not f.name.startswith("torch-") and not is_old_pyyaml(f):
            os.link(f, rest / f.name)
    env = fresh_env(tmp_path, project_wheel, UV_FIND_LINKS=str(rest), UV_OFFLINE="1")
    r = subprocess.run([DFO, "deploy", "--profile", "cpu", "--find-links", str(torch_links),
                        "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["env"].startswith("cpu-") and rep["fingerprint"]["torch"] == "2.13.0+cpu", rep
