"""dfo launch over real SSH (the lab's sshd as the host): the launching connection closes
right after launch; the run goes on, and `dfo status` on a new connection sees it."""

from __future__ import annotations

import json
import time

import pytest

from tests.supervisor_env import FAST, dfo, make_root, write_config  # noqa: F401

pytestmark = [pytest.mark.lab, pytest.mark.slow]


def test_run_outlives_the_ssh_session(lab, lab_hosts_factory, tmp_path, capsys, tiny_assets):  # noqa: F811
    root = make_root(tmp_path)
    hosts = lab_hosts_factory(node_root=str(root))
    cfg = write_config(tmp_path / "c.yaml", tiny_assets, train={"max_steps": 20})
    flags = ["--no-env-check", "--backoff-scale", "0.01"]
    for k, v in FAST.items():
        flags += ["--threshold", f"{k}={v}"]
    t0 = time.monotonic()
    rc, out, err = dfo(capsys, hosts, "launch", "--host", "lab-node", "--config", str(cfg),
                       "--run-name", "detached", "--json", *flags)
    assert rc == 0, err
    assert time.monotonic() - t0 < 60, "launch returns; it does not wait on the run"
    run_id = json.loads(out)["run_id"]
    # that dfo process (and its SSH connection) is gone; ask on a new one
    rc, out, err = dfo(capsys, hosts, "status", "--host", "lab-node", "--json")
    assert rc == 0, err
    run = json.loads(out)["runs"][0]
    assert run["run_id"] == run_id and run["shown_status"] in ("running", "backoff")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        rc, out, _ = dfo(capsys, hosts, "status", "--host", "lab-node", "--json", "--run", run_id)
        run = json.loads(out)["runs"][0]
        if run["status"] in ("done", "failed", "stopped"):
            break
        time.sleep(2)
    assert run["status"] == "done" and run["last_step"] == 20
    rc, out, err = dfo(capsys, hosts, "logs", "--host", "lab-node", "--run", run_id, "--raw")
    assert rc == 0 and '"kind":"final"' in out
    rc, out, err = dfo(capsys, hosts, "status", "--host", "lab-node")
    assert rc == 0 and "detached-" in out and "done" in out
