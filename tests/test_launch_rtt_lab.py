"""`dfo launch` on the lab's proxmox transport (real sshd "node", `pct exec` into LXC
container 200, an env `dfo deploy` built there): at most three remote round trips before the
supervisor starts (one for the facts, env check included, one to write the run and start
it), the first launch after a deploy (the env probe runs) as well as later ones (its
recorded verification holds); a `--dry-run` is one round trip and writes nothing."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
import yaml

from orchestrator.config.inventory import load_inventory
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.plan.launch_facts import VERIFIED_FILE
from orchestrator.transport import open_transport
from tests.helpers.rtt import CountingTransport
from tests.supervisor_env import FAST, REPO

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = "/root/dfo-rtt-test"
MAX_ROUND_TRIPS = 3


@pytest.fixture(scope="module")
def ct(lab, tmp_path_factory):
    from orchestrator.engine.deploy import Deployer
    from orchestrator.engine.wheel import build as build_wheel
    from tests.helpers.wheelhouse import fill_wheelhouse

    fill_wheelhouse(Path(lab.wheelhouse_host_dir))
    base = tmp_path_factory.mktemp("rtt-lab")
    hosts = base / "hosts.yaml"
    hosts.write_text(lab.hosts_yaml(root=ROOT, wheelhouse=True))
    host = load_inventory(str(hosts)).get("lab")
    t = open_transport(host)
    t.run(["rm", "-rf", ROOT], timeout=120, check=True)
    wheel = build_wheel(base / "cache")
    Deployer(t, host, wheel=wheel).deploy()
    old = os.environ.get("DFO_PROJECT_WHEEL")   # launch's env check: the deployed wheel
    os.environ["DFO_PROJECT_WHEEL"] = str(wheel.path)
    py = host.tree.current_python
    assets = posixpath.join(ROOT, "assets")
    t.run([py, "-m", "trainer.model.target", "--out", f"{assets}/target"], timeout=300, check=True)
    t.run([py, "-m", "trainer.data", "synth", "--out", f"{assets}/synth.jsonl", "--num", "256",
           "--seq-len", "64"], timeout=300, check=True)
    cfg = yaml.safe_load((REPO / "orchestrator/config/defaults/tiny-cpu.yaml").read_text())
    cfg["model"]["target_path"] = f"{assets}/target"
    cfg["data"]["path"] = f"{assets}/synth.jsonl"
    cfg["train"].update({"max_steps": 2000, "log_every": 1, "heartbeat_s": 1.0})
    cfg.pop("run", None)
    path = base / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    yield t, host, path
    t.close()
    if old is None:
        os.environ.pop("DFO_PROJECT_WHEEL", None)
    else:
        os.environ["DFO_PROJECT_WHEEL"] = old


def counted_launch(host, cfg, name, **kw):
    """A launch on a fresh connection (as `dfo launch` opens one), counted."""
    t = CountingTransport(open_transport(host))
    run_ops = RunOps(t, host)
    plan = run_ops.launch(LaunchOptions(config=str(cfg), run_name=name, backoff_scale=0.01,
                                    thresholds=dict(FAST), start_timeout=180, **kw))
    return run_ops, t, plan


def test_launch_is_at_most_three_round_trips_before_the_supervisor_starts(ct):
    t, host, cfg = ct
    record = posixpath.join(host.tree.current_env, VERIFIED_FILE)
    t.run(["rm", "-f", record], timeout=60, check=True)   # as right after a deploy
    for i in range(2):      # the env probe runs in the facts round trip, then its record holds
        run_ops, ctr, plan = counted_launch(host, cfg, f"rtt{i}")
        try:
            trips = ctr.calls[:ctr.start_call or 0]
            assert ctr.start_call is not None and ctr.start_call <= MAX_ROUND_TRIPS, ctr.calls
            assert [c["kind"] for c in trips] == ["run"] * len(trips)
            # the env check came from the same round trip (probed, or its record)
            assert t.run(["test", "-f", record], timeout=60).ok
            runs = run_ops.status(plan.run_id)
            assert runs and runs[0].live and runs[0].state.status in ("running", "backoff")
        finally:
            run_ops.stop(plan.run_id, timeout=180)
            ctr.close()


def test_a_dry_run_is_one_round_trip_and_writes_nothing(ct):
    t, host, cfg = ct
    record = posixpath.join(host.tree.current_env, VERIFIED_FILE)
    t.run(["rm", "-f", record], timeout=60, check=True)
    before = t.run(["ls", "-A", ROOT], timeout=60, check=True).out
    run_ops, ctr, plan = counted_launch(host, cfg, "rttdry", dry_run=True)
    assert len(ctr.calls) == 1 and ctr.start_call is None, ctr.calls
    assert not t.run(["test", "-e", record], timeout=60).ok
    assert not t.run(["test", "-e", plan.run_dir], timeout=60).ok
    assert t.run(["ls", "-A", ROOT], timeout=60, check=True).out == before
    ctr.close()
