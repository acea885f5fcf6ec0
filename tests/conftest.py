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

Without root or without LXC the lab fixtures skip with the reason, unless the
environment variable CI is set (true/1/yes): then a lab that cannot come up fails.
Each session takes a lease on the lab; the last session out stops the sshd and
the containers (they stay built), also when tests failed. A killed session's
lease is pruned by the next ``up``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # `import tests.lab` also under a bare `pytest`
    sys.path.insert(0, str(_REPO))

from tests.lab import Lab, LabInfo, LabUnavailable, Sshd  # noqa: E402
from tests.lab.pair import Pair, PairInfo  # noqa: E402
from tests.lab.procs import file_lock  # noqa: E402


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
