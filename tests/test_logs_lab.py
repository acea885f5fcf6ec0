"""dfo logs -f over a real SSH connection (the lab's sshd) while the sshd process serving
that connection is killed: no line lost, none repeated, checked against the remote files."""

from __future__ import annotations

import os
import signal

import pytest

from orchestrator.config.inventory import load_inventory
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.engine.logs import LogFollower
from orchestrator.transport import open_transport
from tests.lab_sockets import client_port, sshd_pids_serving
from tests.supervisor_env import FAST, make_root, tiny_assets, write_config  # noqa: F401

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture
def node(lab, lab_hosts_factory, tmp_path):
    root = make_root(tmp_path)
    inv = load_inventory(str(lab_hosts_factory(node_root=str(root))))
    host = inv.get("lab-node")
    t = open_transport(host)
    yield root, host, t, lab
    t.close()


def test_logs_follow_survives_killed_sshd_session(node, tiny_assets, tmp_path):  # noqa: F811
    root, host, t, lab = node
    ops = RunOps(t, host)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets, train={"max_steps": 24})
    plan = ops.launch(LaunchOptions(config=str(cfg), run_name="drop", fault="fx_race@9",
                                    backoff_scale=0.01, thresholds=FAST, env_check=False))
    got = []
    kills = []
    reconnects = []

    def on_line(ln):
        got.append(ln)
        if len(got) in (25, 70, 120) and len(kills) < 3:
            pids = sshd_pids_serving(lab.ssh_port, client_port(t))
            assert pids, "the sshd serving this connection"
            for p in pids:
                os.kill(p, signal.SIGKILL)
            kills.append(pids)

    f = LogFollower(t, host.layout, plan.run_id, on_line=on_line, follow=True,
                    on_reconnect=lambda n, why: reconnects.append(why))
    status = f.run()
    assert status == "done"
    assert len(kills) >= 2 and len(reconnects) >= 2
    # compare with the files on the far side, read on a new connection
    t2 = open_transport(host)
    try:
        for name in {ln.file for ln in got}:
            remote = t2.get(f"{host.layout.run_dir(plan.run_id)}/{name}").decode("utf-8", "replace")
            assert remote.endswith("\n")
            mine = [ln.text for ln in got if ln.file == name]
            assert mine == remote[:-1].split("\n"), name
    finally:
        t2.close()
    assert {"attempt-1.log", "attempt-2.log", "events.jsonl"} <= {ln.file for ln in got}
