"""Shared pytest fixtures: the lab of real parts (tests/lab, docs/testing.md).

Fixtures:
  lab              session: LabInfo of the sshd node + container 200 (brought up once)
  sshd_only        session: LabInfo of the sshd node only (vmid None); no LXC needed
  lab_hosts_file   a tmp hosts.yaml (hosts "lab" and "lab-node", root /root/dfo)
  lab_hosts_factory(root=..., node_root=..., wheelhouse=False) -> Path: same, your roots
  lab_scratch      Container 201, built, held exclusively for the test: stop/start it freely
  make_sshd        factory for extra sshds (e.g. without pct on PATH); stopped at test end
  lab_pair         PairInfo: containers 202 (head, 10.77.0.1) and 203 (10.77.0.2) up on the
                   pair network (br0 in netns dfo-lab-mn, mn0 in each), held exclusively
                   (flock) for the test; .hosts_yaml(...) names them lab-a, lab-b + group pair
  lab_wheelhouse   session: the lab's wheelhouse dir, filled (cpu lock + an older pyyaml) once per run

Per test:
  local_site       LocalSite(root, hosts, dir): a host root on this machine (env: this venv)
                   and a hosts.yaml whose default host ``local`` is it; cwd an empty dir
  one_torch_thread torch on one thread for the test

Built once per run and shared by every test, also across xdist workers (tests/helpers/shared.py):
  run_shared       the run-shared directory (all workers of the run see the same one)
  tiny_assets      a tiny real target + 256 synthetic samples (trainer's own tools)
  project_wheel    dfo's wheel of these sources (orchestrator.engine.wheel.build)
  cpu_wheelhouse   every wheel of the cpu lock + an older pyyaml (tests/helpers/wheelhouse.py)
  _cxx_cache       (autouse) $CXX: a g++ that builds each distinct kernel once a run
Define such fixtures here, never import one into a test module (pytest would register the
copy per module and build it again there).

Under xdist (scripts/test.sh: -n 2 --dist loadgroup) the lab tests run on one lane, every
other file whole on either, the ``solo`` tests alone (tests/helpers/lanes.py).

Without root or without LXC the lab fixtures skip with the reason, unless the
environment variable CI is set (true/1/yes): then a lab that cannot come up fails.
Each session takes a lease on the lab; the last session out stops the sshd and
the containers (they stay built), also when tests failed. A killed session's
lease is pruned by the next ``up``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# One torch (OpenMP) thread per process: the suite runs two lanes on two cores, and a tiny
# model gains nothing from a second thread, while two lanes of two spinning threads each
# fight over the cores. Set before anything imports torch; every local process the tests
# start (dfo, its supervisor, the trainer) inherits it. A run that sets it keeps its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # `import tests.lab` also under a bare `pytest`
    sys.path.insert(0, str(_REPO))

from tests.helpers import lanes  # noqa: E402
from tests.helpers.shared import built_once, locked, run_dir, sources_key  # noqa: E402
from tests.lab import Lab, LabInfo, LabUnavailable, Sshd  # noqa: E402
from tests.lab.pair import Pair, PairInfo  # noqa: E402
from tests.lab.procs import file_lock  # noqa: E402


# A test run started in the background of a non-interactive shell (`bash .ci/run &`, nohup)
# inherits SIGINT ignored, and so would every dfo a test starts: Python leaves an ignored
# SIGINT ignored, and the tests that press Ctrl-C on dfo would wait for nothing. Ctrl-C
# behaves in the tests as in a terminal: the default handler here, the default disposition
# in every child (a handler does not survive exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def _unavailable(reason: str):
    if _ci():
        pytest.fail(f"the lab must come up under CI: {reason}", pytrace=False)
    pytest.skip(f"lab unavailable: {reason}")


@pytest.fixture(scope="session")
def _lab_manager():
    if os.geteuid() != 0:
        _unavailable("needs root (run as root, see docs/testing.md)")
    lab = Lab()
    yield lab
    lab.release()  # drop this session's lease; the last one out stops sshd + containers


@pytest.fixture(scope="session")
def lab(_lab_manager: Lab) -> LabInfo:
    try:
        return _lab_manager.up(container=True)
    except LabUnavailable as e:
        _unavailable(str(e))


@pytest.fixture(scope="session")
def sshd_only(_lab_manager: Lab) -> LabInfo:
    try:
        return _lab_manager.up(container=False)
    except LabUnavailable as e:
        _unavailable(str(e))


@pytest.fixture
def lab_hosts_factory(lab: LabInfo, tmp_path: Path):
    def make(root: str = "/root/dfo", *, node_root: str | None = None,
             wheelhouse: bool = False, name: str = "hosts.yaml") -> Path:
        path = tmp_path / name
        path.write_text(lab.hosts_yaml(root=root, node_root=node_root, wheelhouse=wheelhouse))
        return path

    return make


@pytest.fixture
def lab_hosts_file(lab_hosts_factory) -> Path:
    return lab_hosts_factory()


@pytest.fixture(scope="module", autouse=True)
def _lab_roots_cleared(request):
    """After a module of lab tests, the dfo roots it deployed into the containers are removed
    (each module uses roots of its own, about 1 GB each): a run never piles them up on disk."""
    mod = request.module
    manager = None
    if os.geteuid() == 0 and any(i.get_closest_marker("lab") for i in request.session.items
                                 if i.module is mod):
        manager = request.getfixturevalue("_lab_manager")
    yield
    if manager is not None:
        manager.clear_roots()


@pytest.fixture(scope="session")
def _lab_scratch_built(_lab_manager: Lab, lab: LabInfo):
    try:
        return _lab_manager.scratch()
    except LabUnavailable as e:
        _unavailable(str(e))


@pytest.fixture
def lab_scratch(_lab_manager: Lab, _lab_scratch_built):
    """Container 201, held exclusively (flock) for this test: no other session's
    test stops or starts it meanwhile."""
    with file_lock(_lab_manager.state_dir / f"scratch-{_lab_scratch_built.vmid}.lock"):
        yield _lab_scratch_built


@pytest.fixture
def make_sshd(tmp_path_factory):
    if os.geteuid() != 0:
        _unavailable("needs root")
    started: list[Sshd] = []

    def make(*, path_dirs: list[str] | None = None):
        s = Sshd(tmp_path_factory.mktemp("sshd"), path_dirs=path_dirs)
        try:
            info, _ = s.up()
        except LabUnavailable as e:
            _unavailable(str(e))
        started.append(s)
        return info

    yield make
    for s in started:
        s.down()


@pytest.fixture
def lab_pair(_lab_manager: Lab) -> PairInfo:
    """Containers 202 and 203 on the pair network, held exclusively (flock) for this
    test: stop/start them freely; the next test's ``up`` repairs whatever it finds
    (a stopped container, a missing veth pair or namespace)."""
    pair = Pair(_lab_manager)
    with file_lock(pair.lock):
        try:
            info = pair.up()
        except LabUnavailable as e:
            _unavailable(str(e))
        yield info


# ---------------------------------------------------------------- built once per run

@pytest.fixture(scope="session")
def run_shared(tmp_path_factory) -> Path:
    return run_dir(tmp_path_factory)


@pytest.fixture
def local_site(tmp_path, monkeypatch):
    """A host root on this machine whose env is this venv, the hosts.yaml naming it as the
    default host ``local``, and the test's directory (``tests.supervisor_env.LocalSite``);
    the test runs in an empty directory of its own, so nothing depends on the cwd."""
    from tests.supervisor_env import local_site as site

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return site(tmp_path)


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test (in-process training runs: as the trainer's
    subprocesses run with OMP_NUM_THREADS=1, and steady on a shared machine)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_assets(run_shared: Path) -> Path:
    """A tiny real target and synthetic data, made by the trainer's own tools; read-only
    for tests (copy what you change)."""
    def build(d: Path) -> None:
        py = sys.executable
        subprocess.run([py, "-m", "trainer.model.target", "--out", str(d / "target")], check=True,
                       capture_output=True, cwd=_REPO, timeout=300)
        subprocess.run([py, "-m", "trainer.data", "synth", "--out", str(d / "synth.jsonl"),
                        "--num", "256", "--seq-len", "64"], check=True, capture_output=True,
                       cwd=_REPO, timeout=300)

    return built_once(run_shared, "tiny", sources_key(), build)


@pytest.fixture(scope="session", autouse=True)
def _cxx_cache(run_shared: Path):
    """Inductor's C++ builds through the run's caching g++ (tests/helpers/cxx_cache.py): a
    kernel source compiled once in the run is not compiled again by another test."""
    from tests.helpers.cxx_cache import install

    path = install(run_shared)
    if path is None:
        yield None
        return
    os.environ["CXX"] = path
    try:
        yield path
    finally:
        os.environ.pop("CXX", None)


@pytest.fixture(scope="session")
def project_wheel(run_shared: Path):
    """dfo's wheel of the sources as they were when the run started (built once)."""
    from orchestrator.engine.wheel import build

    with locked(run_shared, "project-wheel"):
        return build(run_shared / "dfo-cache")


@pytest.fixture(scope="session")
def cpu_wheelhouse(run_shared: Path) -> Path:
    from tests.helpers.wheelhouse import shared_wheelhouse

    return shared_wheelhouse(run_shared)


@pytest.fixture(scope="session")
def lab_wheelhouse(_lab_manager: Lab, cpu_wheelhouse: Path, run_shared: Path) -> Path:
    """The lab's wheelhouse (the containers' /mnt/wheelhouse: ``LabInfo.wheelhouse_host_dir``),
    filled once per run."""
    from tests.helpers.wheelhouse import copy_missing

    dest = _lab_manager.wheelhouse
    with locked(run_shared, "lab-wheelhouse"):
        copy_missing(cpu_wheelhouse, dest)
    return dest


# ------------------------------------------------------------------- lanes (xdist)

def pytest_configure(config):
    lanes.configure(config)


def pytest_unconfigure(config):
    lanes.unconfigure(config)


def pytest_collection_modifyitems(config, items):
    lanes.assign(config, items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return lanes.make_scheduler(config, log)


@pytest.fixture(autouse=True)
def _lane(request, run_shared: Path):
    """A ``solo`` test runs with no other test of the run beside it (tests/helpers/lanes.py)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    with lanes.lane(run_shared, solo=request.node.get_closest_marker("solo") is not None):
        yield
