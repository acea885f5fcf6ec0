"""One run across the lab pair (containers 202 and 203 on the pair network, 10.77.0.1/.2 on
mn0), with real parts: `dfo deploy --group pair` (real uv, offline from the wheelhouse) into
both containers once per module, then `dfo hosts check/launch/logs/status/stop --group pair`
through the CLI: real supervisors, real torchrun + gloo over mn0, a fault on node 1 only, a
trainer on lab-b stopped with kill -STOP, a stopped container. Figures (wall seconds) are
printed with -s and kept in FIGURES."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dfo_contract import events
from orchestrator.config.inventory import load_inventory
from orchestrator.transport import open_transport
from tests.lab.pair import PairInfo
from tests.supervisor_env import FAST, dfo, wait_for, write_config  # noqa: F401

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1500)]

ROOT = "/root/dfo-pair-test"
ASSETS = f"{ROOT}/assets"
FIGURES: dict[str, float] = {}

ALL_REDUCE = r"""
import datetime, os, socket, sys
import torch, torch.distributed as dist
rank = int(sys.argv[1])
store = dist.TCPStore(sys.argv[2], int(sys.argv[3]), 2, rank == 0,
                      timeout=datetime.timedelta(seconds=120))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=120))
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(f"rank {rank} on {socket.gethostname()} sum {t.item():g}")
dist.destroy_process_group()
"""


def fast_flags(**extra):
    out = ["--no-env-check", "--backoff-scale", "0.01"]
    # FAST's train_s: two nodes on 2 busy cores can stall a step for seconds; no test
    # here judges a hang, and a false one would hide the injected fault
    for k, v in {**FAST, **extra}.items():
        out += ["--threshold", f"{k}={v}"]
    return out


def figure(name: str, seconds: float) -> None:
    FIGURES[name] = round(seconds, 1)
    print(f"\nFIGURE {name} = {seconds:.1f} s")


@pytest.fixture(scope="module")
def _state(tmp_path_factory):
    """Per module: the hosts.yaml, the transports; both roots are removed at module end."""
    st = {"deployed": False, "ts": [], "base": tmp_path_factory.mktemp("mn-lab")}
    yield st
    for t in st["ts"]:
        t.run(["rm", "-rf", ROOT], timeout=300)  # ~1 GB of env + uv cache per container
        t.close()
    if FIGURES:
        print("\nFIGURES " + json.dumps(FIGURES))


@pytest.fixture
def pair(lab_pair: PairInfo, _state, tiny_assets, lab_wheelhouse, project_wheel, capsys,
         monkeypatch):
    """The cpu env in both containers by `dfo deploy --group pair` (the first test; later
    ones find the pair up again), and the tiny assets at ASSETS in both."""
    st = _state
    hosts = st["base"] / "hosts.yaml"
    hosts.write_text(lab_pair.hosts_yaml(root=ROOT, groups=True, wheelhouse=True))
    inv = load_inventory(str(hosts))
    for t in st["ts"]:
        t.close()
    st["ts"] = [open_transport(inv.get(n)) for n in lab_pair.host_names]
    if not st["deployed"]:
        monkeypatch.setenv("DFO_PROJECT_WHEEL", str(project_wheel.path))  # built once per run
        for t in st["ts"]:  # the first test starts from empty roots
            t.run(["rm", "-rf", ROOT], timeout=120, check=True)
        t0 = time.monotonic()
        rc, out, err = dfo(capsys, hosts, "deploy", "--group", lab_pair.group, "--json")
        assert rc == 0, (out, err)
        figure("deploy_group_s", time.monotonic() - t0)
        for t in st["ts"]:
            for f in sorted(Path(tiny_assets).rglob("*")):
                rel = f.relative_to(tiny_assets)
                dest = f"{ASSETS}/{rel}"
                if f.is_dir():
                    t.run(["mkdir", "-p", dest], timeout=60, check=True)
                else:
                    t.run(["mkdir", "-p", str(Path(dest).parent)], timeout=60, check=True)
                    t.put(f.read_bytes(), dest)
        st["deployed"] = True
    return lab_pair, hosts, st["ts"], st["base"]


def config(base: Path, name: str, **train) -> Path:
    p = write_config(base / f"{name}.yaml", Path(ASSETS), **train)
    return p


def state_of(t, run_id: str) -> dict:
    return json.loads(t.get(f"{ROOT}/runs/{run_id}/state.json"))


def events_of(t, run_id: str) -> list[events.Event]:
    return events.read_events(t.get(f"{ROOT}/runs/{run_id}/events.jsonl").decode())


def ckpts(t, name: str) -> list[str]:
    r = t.run(["sh", "-c", f"ls -d {ROOT}/checkpoints/{name}/step_* 2>/dev/null || true"], timeout=60)
    return r.out.split()


def test_gloo_all_reduce_across_the_pair(pair):
    info, hosts, ts, base = pair
    py = f"{ROOT}/envs/current/bin/python"
    res = [None, None]

    def go(i):
        res[i] = ts[i].run([py, "-c", ALL_REDUCE, str(i), info.head_addr, "29500"],
                           env={"GLOO_SOCKET_IFNAME": info.ifname}, timeout=300)

    th = threading.Thread(target=go, args=(0,))
    th.start()
    go(1)
    th.join(330)
    assert res[0].ok and res[1].ok, (res[0].err, res[1].err)
    assert res[0].out.strip() == "rank 0 on dfo-lab-202 sum 3"
    assert res[1].out.strip() == "rank 1 on dfo-lab-203 sum 3"


def test_hosts_check_group_env_agrees_and_head_reachable(pair, capsys):
    info, hosts, ts, base = pair
    rc, out, err = dfo(capsys, hosts, "hosts", "check", "--group", info.group, "--json")
    assert rc == 0, (out, err)
    d = json.loads(out)
    assert [h["host"] for h in d["hosts"]] == list(info.host_names) and all(h["ok"] for h in d["hosts"])
    assert info.head_addr in out


def test_fault_on_node_1_restarts_the_whole_run_with_the_fallback(pair, capsys):
    info, hosts, ts, base = pair
    cfg = config(base, "mnf", train={"max_steps": 10}, checkpoint={"every": 2})
    t0 = time.monotonic()
    rc, out, err = dfo(capsys, hosts, "launch", "--group", info.group, "--config", str(cfg),
                       "--json", "--fault", "oom@5", "--fault-node", "1", *fast_flags())
    assert rc == 0, err
    rid = json.loads(out)["run_id"]
    wait_for(lambda: (state_of(ts[0], rid).get("last_step") or 0) >= 1, 300, "first step")
    figure("launch_to_first_step_s", time.monotonic() - t0)
    wait_for(lambda: state_of(ts[0], rid)["status"] in ("done", "failed", "stopped"), 400, "end")
    sts = [state_of(t, rid) for t in ts]
    assert [s["status"] for s in sts] == ["done", "done"], [s.get("reason") for s in sts]
    evs = [events_of(t, rid) for t in ts]
    starts = [[e for e in ev if e.kind == "attempt_start"] for ev in evs]
    assert [len(s) for s in starts] == [2, 2]          # the whole run restarted once
    a2 = [s[1] for s in starts]
    assert a2[0].overrides == a2[1].overrides != starts[0][0].overrides
    assert a2[0].resume and a2[0].resume == a2[1].resume   # the head's checkpoint
    # the fault was on node 1 only: only lab-b's attempt 1 saw the oom
    assert any(e.kind == "fallback" for e in evs[0])
    logs = [t.run(["cat", f"{ROOT}/runs/{rid}/attempt-1.log"], timeout=60).out for t in ts]
    assert "OutOfMemoryError" in logs[1] and "OutOfMemoryError" not in logs[0]
    fault_t = [e for e in evs[1] if e.kind == "attempt_end"][0].t   # node 1's oom
    figure("fault_to_restart_s", a2[0].t - fault_t)   # the head's attempt 2 starts
    head2 = ts[0].run(["cat", f"{ROOT}/runs/{rid}/attempt-2.log"], timeout=60).out
    steps2 = [json.loads(x.split("@dfo ", 1)[1]) for x in head2.splitlines() if "@dfo {" in x]
    first2 = [m["t"] for m in steps2 if m.get("kind") == "step"][0]
    figure("fault_to_first_step_again_s", first2 - fault_t)
    # checkpoints only in lab-a's root
    assert ckpts(ts[0], "mnf") and not ckpts(ts[1], "mnf")
    rc, out, err = dfo(capsys, hosts, "logs", "--group", info.group, "--run", rid)
    assert rc == 0, err
    lines = out.splitlines()
    assert any(x.startswith("lab-a | ") for x in lines) and any(x.startswith("lab-b | ") for x in lines)


def test_stop_group_stops_both_with_one_checkpoint_on_the_head(pair, capsys):
    info, hosts, ts, base = pair
    cfg = config(base, "mns", train={"max_steps": 5000}, checkpoint={"every": 4000})
    rc, out, err = dfo(capsys, hosts, "launch", "--group", info.group, "--config", str(cfg),
                       "--json", *fast_flags())
    assert rc == 0, err
    rid = json.loads(out)["run_id"]
    try:
        wait_for(lambda: (state_of(ts[0], rid).get("last_step") or 0) >= 3, 300, "steps")
    finally:
        t0 = time.monotonic()
        rc, out, err = dfo(capsys, hosts, "stop", "--group", info.group, "--json")
        figure("stop_group_s", time.monotonic() - t0)
    d = json.loads(out)
    assert rc == 0 and d["run_id"] == rid, err
    assert [n["run"]["status"] for n in d["nodes"]] == ["stopped", "stopped"]
    assert len(ckpts(ts[0], "mns")) == 1 and not ckpts(ts[1], "mns")


def test_a_stopped_trainer_on_lab_b_is_frozen_there_and_the_group_restarts(pair, capsys):
    # kill -STOP of lab-b's trainer: the head's ranks wait idle on it and its hang_s comes
    # due first; lab-b reports its stopped processes, so the head's judgement is lab-b's
    # freeze (no fallback: the same config again), not the head's compile_hang
    info, hosts, ts, base = pair
    cfg = config(base, "mnz", train={"max_steps": 14}, checkpoint={"every": 4})
    rc, out, err = dfo(capsys, hosts, "launch", "--group", info.group, "--config", str(cfg),
                       "--json", *fast_flags(hang_s=10))
    assert rc == 0, err
    rid = json.loads(out.strip().splitlines()[-1])["run_id"]   # after a deploy's FIGURE
    try:
        wait_for(lambda: (state_of(ts[0], rid).get("last_step") or 0) >= 2, 300, "steps")
        torchrun = state_of(ts[1], rid)["trainer_pids"][0]
        r = ts[1].run(["sh", "-c", f"w=$(ps -o pid= --ppid {torchrun}); kill -STOP $w; "
                       "echo $w"], timeout=60, check=True)
        workers = r.out.split()
        assert workers, r.err
        wait_for(lambda: state_of(ts[0], rid)["status"] in ("done", "failed", "stopped"), 600,
                 "the head's end")
    finally:
        dfo(capsys, hosts, "stop", "--group", info.group)
    sts = [state_of(t, rid) for t in ts]
    assert [s["status"] for s in sts] == ["done", "done"], [s.get("reason") for s in sts]
    evs = [events_of(t, rid) for t in ts]
    cause = [e for e in evs[0] if e.kind == "group_decision"][0].cause
    assert (cause.cls, cause.node, cause.host) == ("frozen", 1, "lab-b"), cause
    assert cause.reason.startswith("node lab-b: process") and all(
        w in cause.reason for w in workers), cause.reason
    assert not [e for ev in evs for e in ev if e.kind == "classified" and
                e.cls == "compile_hang"]
    assert [f.step for f in evs[0] if f.kind == "fallback"] == [None]   # the same config
    starts = [[e for e in ev if e.kind == "attempt_start"] for ev in evs]
    assert [len(s) for s in starts] == [2, 2]
    assert starts[0][1].overrides == starts[1][1].overrides == starts[0][0].overrides


def test_stopped_container_is_node_lost_then_up_restarts_it(pair, capsys):
    info, hosts, ts, base = pair
    cfg = config(base, "mnl", train={"max_steps": 5000}, checkpoint={"every": 4000})
    rc, out, err = dfo(capsys, hosts, "launch", "--group", info.group, "--config", str(cfg),
                       "--json", *fast_flags())
    assert rc == 0, err
    rid = json.loads(out)["run_id"]
    try:
        wait_for(lambda: (state_of(ts[0], rid).get("last_step") or 0) >= 2, 300, "steps")
        t0 = time.monotonic()
        subprocess.run(info.lab.ssh_argv("pct", "stop", str(info.vmids[1])), check=True,
                       timeout=120, capture_output=True, stdin=subprocess.DEVNULL)
        wait_for(lambda: state_of(ts[0], rid)["status"] in ("done", "failed", "stopped"), 600,
                 "the head's end")
        figure("node_lost_detect_s", time.monotonic() - t0)
    finally:
        dfo(capsys, hosts, "stop", "--group", info.group)
    st = state_of(ts[0], rid)
    assert st["status"] == "failed" and "lab-b" in st["reason"] and "lost" in st["reason"], st
    assert "start it" in st["reason"]
    assert any(e.kind == "node_lost" and e.host == "lab-b" for e in events_of(ts[0], rid))
    rc, out, err = dfo(capsys, hosts, "status", "--group", info.group, "--run", rid)
    assert "failed" in out and "lab-b" in (out + err)


def test_next_up_restarts_the_container_and_the_env_survived(pair, capsys):
    """After the previous test stopped 203: the fixture's ``up`` started it again, and the
    env deployed on its rootfs is still there (a deploy --check agrees)."""
    info, hosts, ts, base = pair
    r = ts[1].run([f"{ROOT}/envs/current/bin/python", "-c", "import torch; print(torch.__version__)"],
                  timeout=120)
    assert r.ok and r.out.strip(), r.err
    rc, out, err = dfo(capsys, hosts, "hosts", "check", "--group", info.group, "--json")
    assert rc == 0, (out, err)
