"""The free-space check before a new env is built counts dfo's own leftovers under the root:
the half-built envs (and ``.trash`` dirs) it removes first and the uv cache it reuses. After a
deploy that filled the disk, freeing space elsewhere is then enough for the retry.

The real check: the state probe and ``deploy_reclaim.sh`` on the local transport, over a
root on a real tmpfs that is nearly full (``tests/helpers/tmpfs.py``)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from orchestrator.config.inventory import HostConfig
from orchestrator.config.profiles import load_profile
from orchestrator.engine.deploy import Deployer, local_uv
from orchestrator.common.errors import DeployError
from orchestrator.plan import deploy_plan as dp
from orchestrator.plan import deploy_space as ds
from orchestrator.transport.local import LocalTransport
from tests.helpers.tmpfs import fill, tmpfs  # noqa: F401

MB = 1 << 20


def test_parse_and_check_space():
    from orchestrator.transport.base import Result

    r = Result(("x",), 0, b"partial\tcpu-1\npartial\t.trash.cpu-0.7\nuv_cache_kb\t8192\n"
                          b"partial_kb\t32768\nend\tok\n", b"")
    found = ds.parse_reclaim(r)
    assert found == ds.Reclaimable(8192, 32768, ("cpu-1", ".trash.cpu-0.7"), True)
    assert ds.check_space(4 * 1024, 40, found, host="h", root="/r") is None
    assert ds.check_space(4 * 1024, 80, found, host="h", root="/r") == (
        "disk full on h: /r has 4 MB free + 32 MB in half-built envs dfo removes first "
        "(cpu-1, .trash.cpu-0.7) + 8 MB in its uv cache that the install reuses, the env "
        "needs about 80 MB")
    # the cache counts at most as much as the env needs; nothing measured: df alone
    assert ds.check_space(0, 10, ds.Reclaimable(1 << 30, 0), host="h", root="/r") is None
    assert ds.check_space(1024, 10, ds.Reclaimable(), host="h", root="/r") == \
        "disk full on h: /r has 1 MB free, the env needs about 10 MB"
    assert ds.check_space(None, 10, ds.Reclaimable(), host="h", root="/r") is None


@pytest.mark.slow
def test_a_retry_after_a_full_disk_counts_dfos_own_leftovers(tmp_path, tmpfs):  # noqa: F811
    fs = tmpfs(64 * MB)
    root = fs / "root"
    host = HostConfig(name="local", transport="local", root=str(root), source="test")

    def deployer(min_free_mb: int) -> Deployer:
        prof = dataclasses.replace(load_profile("cpu"), min_free_mb=min_free_mb)
        return Deployer(LocalTransport("local"), host, profile=prof)

    d = deployer(40)
    lock, _, env_dir = d.local_facts()
    target = env_dir.rsplit("/", 1)[1]
    # what a deploy that ran out of space leaves: its half-built env, a .trash dir of an
    # interrupted removal, uv's cache with what it had fetched (a file of it hardlinked into
    # the env counts once, in the cache)
    half = root / "envs" / target
    (half / "lib").mkdir(parents=True)
    (half / "lib" / "big.so").write_bytes(b"\1" * (30 * MB))
    (root / "envs" / f".trash.{target}.7").mkdir()
    (root / "envs" / f".trash.{target}.7" / "x").write_bytes(b"\2" * (2 * MB))
    (root / "uv-cache").mkdir()
    (root / "uv-cache" / "torch.whl").write_bytes(b"\3" * (8 * MB))
    (half / "lib" / "cached.so").hardlink_to(root / "uv-cache" / "torch.whl")
    fill(fs, 4 * MB)

    state = d.probe.state(env_dir, "/nonexistent.whl")
    plan = dp.make_plan(state, target=target, lock=lock, expect=d.profile.expect,
                        local_uv=local_uv()[1], wheel_remote="/nonexistent.whl", force=False)
    assert plan.clean == [target]
    # df alone refuses (what the retry met before): 4 MB free < 40 MB
    assert dp.check_disk(state.df_kb, 40, host="local", root=str(root)) is not None
    d.envs.check_space(state, plan.clean)    # 4 + 32 removed first + 8 reused >= 40
    with pytest.raises(DeployError) as ei:
        deployer(80).envs.check_space(state, plan.clean)
    msg = str(ei.value)
    assert re.match(rf"disk full on local: {re.escape(str(root))} has [34] MB free \+ 32 MB in "
                    rf"half-built envs dfo removes first \({re.escape(target)}, "
                    rf"\.trash\.{re.escape(target)}\.7\) \+ 8 MB in its uv cache that the "
                    r"install reuses, the env needs about 80 MB", msg), msg
    assert "envs/current is untouched" in msg
