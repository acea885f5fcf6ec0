"""The supervisor inside the lab's LXC container (systemd is PID 1 there), reached through
the real sshd and the `pct` stand-in, from an env deployed by `dfo deploy` with this tree's
wheel: the FX error recovery under a transient systemd unit, `kill -9` of the supervisor
(systemd restarts it; no unwatched trainer), a second launch refused, and `dfo stop`."""

from __future__ import annotations

import posixpath
import time
from pathlib import Path

import pytest
import yaml

from dfo_contract import events
from orchestrator.common.errors import LockHeldError
from orchestrator.config.inventory import load_inventory
from orchestrator.engine.runs import LaunchOptions, RunOps
from orchestrator.transport import open_transport
from tests.supervisor_env import FAST, REPO

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = "/root/dfo-sup-test"


@pytest.fixture(scope="module")
def ct(lab, lab_wheelhouse, project_wheel, tmp_path_factory):
    from orchestrator.engine.deploy import Deployer

    base = tmp_path_factory.mktemp("sup-lab")
    hosts = base / "hosts.yaml"
    hosts.write_text(lab.hosts_yaml(root=ROOT, wheelhouse=True))
    host = load_inventory(str(hosts)).get("lab")
    t = open_transport(host)
    t.run(["rm", "-rf", ROOT], timeout=120, check=True)
    wheel = project_wheel
    Deployer(t, host, wheel=wheel).deploy()
    # `dfo deploy --check` (run by launch) must compare against the same wheel, not a new
    # build of a tree other people are editing right now
    import os

    old = os.environ.get("DFO_PROJECT_WHEEL")
    os.environ["DFO_PROJECT_WHEEL"] = str(wheel.path)
    py = host.tree.current_python
    assets = posixpath.join(ROOT, "assets")
    t.run([py, "-m", "trainer.model.target", "--out", f"{assets}/target"], timeout=300, check=True)
    t.run([py, "-m", "trainer.data", "synth", "--out", f"{assets}/synth.jsonl", "--num", "256",
           "--seq-len", "64"], timeout=300, check=True)

    def config(name: str, **train) -> Path:
        cfg = yaml.safe_load((REPO / "orchestrator" / "config" / "defaults" / "tiny-cpu.yaml").read_text())
        cfg["model"]["target_path"] = f"{assets}/target"
        cfg["data"]["path"] = f"{assets}/synth.jsonl"
        cfg["train"].update({"max_steps": 12, "log_every": 1, "heartbeat_s": 1.0}, **train)
        cfg["checkpoint"].update({"every": 4, "keep": 5})
        cfg.pop("run", None)
        p = base / f"{name}.yaml"
        p.write_text(yaml.safe_dump(cfg))
        return p

    yield RunOps(t, host), t, host, config
    t.close()
    if old is None:
        os.environ.pop("DFO_PROJECT_WHEEL", None)
    else:
        os.environ["DFO_PROJECT_WHEEL"] = old


def evs(t, host, run_id):
    return events.read_events(t.get(f"{host.tree.run_dir(run_id)}/events.jsonl").decode())


def wait(run_ops, run_id, pred, timeout=240, what="condition"):
    """The run as ``dfo status --json`` shows it once ``pred`` holds for that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = run_ops.status(run_id)[0].to_json()
        if pred(info):
            return info
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}: {info.get('last_event')}")


def test_fx_recovery_in_the_container_under_systemd(ct):
    run_ops, t, host, config = ct
    plan = run_ops.launch(LaunchOptions(config=str(config("fx")), run_name="fx", fault="fx_race@6",
                                    backoff_scale=0.01, thresholds=FAST))   # env --check on
    assert plan.mode == "systemd" and plan.start_argv[0] == "systemd-run"
    info = wait(run_ops, plan.run_id, lambda i: i["status"] in ("done", "failed", "stopped"),
                what="the run to end")
    assert info["status"] == "done", info.get("reason")
    assert info["mode"] == "systemd"
    e = evs(t, host, plan.run_id)
    cl = [x for x in e if x.kind == "classified"]
    assert cl[0].cls == "fx_trace_race" and cl[-1].cls == "done"
    fb = [x for x in e if x.kind == "fallback"][0]
    assert fb.step == "layout_ddp"   # the tiny config does not compile
    starts = [x for x in e if x.kind == "attempt_start"]
    assert starts[1].resume.endswith("/step_4")


def test_kill9_supervisor_second_launch_and_stop_in_the_container(ct):
    run_ops, t, host, config = ct
    cfg = config("long", max_steps=2000)
    plan = run_ops.launch(LaunchOptions(config=str(cfg), run_name="long", backoff_scale=0.01,
                                    thresholds=FAST, env_check=False))
    run_id = plan.run_id
    try:
        info = wait(run_ops, run_id, lambda i: (i.get("last_step") or 0) >= 5, what="step 5")
        with pytest.raises(LockHeldError, match=f"run {run_id} is live"):
            run_ops.plan(LaunchOptions(config=str(cfg), env_check=False))
        sup, trainer = info["pid"], info["trainer_pids"][0]
        t.run(["kill", "-9", str(sup)], check=True)
        wait(run_ops, run_id, lambda i: i.get("live") and i["pid"] != sup and i["attempt"] >= 2,
             60, "systemd to restart the supervisor")
        r = t.run(["sh", "-c", 'kill -0 "$1" 2>/dev/null && echo alive || echo gone', "x",
                   str(trainer)])
        assert r.out.strip() == "gone", "the old trainer must not run unwatched"
        e = evs(t, host, run_id)
        assert [x for x in e if x.kind == "supervisor_start"][-1].resumed is True
        wait(run_ops, run_id, lambda i: i["attempts"][-1].get("resume") and
             (i.get("last_step") or 0) > (i.get("last_checkpoint") or {}).get("step", 0), 120,
             "the new attempt to train")
    finally:
        info = run_ops.stop(run_id, timeout=120).to_json()
    assert info["status"] == "stopped"
    assert info["last_checkpoint"], "the trainer saved a checkpoint on SIGTERM"
    r = t.run(["systemctl", "is-active", f"dfo-{run_id}"])
    assert r.out.strip() != "active"


def test_logs_follow_through_pct_survives_killed_sshd_session(ct, lab):
    """logs -f into the container (ssh -> pct exec): kill the sshd serving the connection
    twice; every line arrives exactly once, compared with the files in the container."""
    import os
    import signal

    from orchestrator.engine.logs import LogFollower
    from tests.lab_sockets import client_port, sshd_pids_serving

    run_ops, t, host, config = ct
    plan = run_ops.launch(LaunchOptions(config=str(config("drop", max_steps=20)), run_name="drop",
                                    fault="oom@7", backoff_scale=0.01, thresholds=FAST,
                                    env_check=False))
    got, kills, reconnects = [], [], []

    def on_line(ln):
        got.append(ln)
        if len(got) in (20, 60) and len(kills) < 2:
            pids = sshd_pids_serving(lab.ssh_port, client_port(t))
            assert pids
            for p in pids:
                os.kill(p, signal.SIGKILL)
            kills.append(pids)

    status = LogFollower(t, host.tree, plan.run_id, on_line=on_line, follow=True,
                         on_reconnect=lambda n, why: reconnects.append(why)).run()
    assert status == "done" and len(kills) == 2 and len(reconnects) >= 2
    for name in {ln.file for ln in got}:
        remote = t.get(f"{host.tree.run_dir(plan.run_id)}/{name}").decode("utf-8", "replace")
        assert [ln.text for ln in got if ln.file == name] == remote[:-1].split("\n"), name
    assert {"attempt-1.log", "attempt-2.log"} <= {ln.file for ln in got}
