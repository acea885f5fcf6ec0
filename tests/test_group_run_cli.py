"""`dfo launch/status/logs/stop --group` (the run side) through the real CLI on two `transport: local`
hosts with their own roots (loopback, CPU)."""

from __future__ import annotations

import fcntl
import json

import pytest

from tests.supervisor_env import dfo, write_config  # noqa: F401,F811
from tests.lab.procs import free_port_pair
from tests.test_group_runs_local import env_root


def group_yaml(tmp_path, envs=(True, True)):
    roots = [env_root(tmp_path, n, None, e) for n, e in zip(("a", "b"), envs, strict=True)]
    p = tmp_path / "hosts.yaml"
    p.write_text(f"""default: a
hosts:
  a:
    transport: local
    root: {roots[0]}
  b:
    transport: local
    root: {roots[1]}
groups:
  pair:
    hosts: [a, b]
    head_addr: 127.0.0.1
    port: {free_port_pair()}
    ifname: lo
""")
    return p, roots


@pytest.mark.parametrize("cmd", [["launch"], ["logs"], ["status"], ["stop"]])
def test_group_and_host_together_is_one_line_exit_2(tmp_path, capsys, cmd):
    p, _ = group_yaml(tmp_path)
    rc, out, err = dfo(capsys, p, *cmd, "--group", "pair", "--host", "a")
    assert rc == 2 and err.startswith("dfo: error: dfo ") and "--host and --group cannot be combined" in err
    assert err.count("\n") == 1


def fast_flags():
    from tests.supervisor_env import FAST

    out = ["--no-env-check", "--backoff-scale", "0.01"]
    for k, v in FAST.items():
        out += ["--threshold", f"{k}={v}"]
    return out


def test_dry_run_prints_each_nodes_plan(tmp_path, capsys, tiny_assets):  # noqa: F811
    p, roots = group_yaml(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    rc, out, err = dfo(capsys, p, "launch", "--group", "pair", "--config", str(cfg), "--dry-run",
                       "--no-env-check")
    assert rc == 0, err
    assert "node 0 a (head)" in out and "node 1 b" in out
    assert out.count("torch.distributed.run --nnodes 2") == 2 and "is_host=1" in out
    assert "GLOO_SOCKET_IFNAME=lo" in out and "--parallel.layout=ddp" in out
    rc, out, err = dfo(capsys, p, "launch", "--group", "pair", "--config", str(cfg), "--dry-run",
                       "--no-env-check", "--json")
    d = json.loads(out)
    assert rc == 0 and d["started"] is False and [n["host"] for n in d["nodes"]] == ["a", "b"]
    assert {n["run_id"] for n in d["nodes"]} == {d["run_id"]}
    assert not (roots[0] / "runs").exists() and not (roots[1] / "runs").exists()


def test_fault_node_puts_the_fault_on_that_node_only(tmp_path, capsys, tiny_assets):  # noqa: F811
    p, roots = group_yaml(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    args = ["launch", "--group", "pair", "--config", str(cfg), "--dry-run", "--no-env-check",
            "--json", "--fault", "oom@3"]
    rc, out, err = dfo(capsys, p, *args, "--fault-node", "1")
    assert rc == 0, err
    envs = [n["env"] for n in json.loads(out)["nodes"]]
    assert "DFO_FAULT" not in envs[0] and envs[1]["DFO_FAULT"] == "oom@3"
    rc, out, err = dfo(capsys, p, *args)      # without it: every node
    assert [n["env"].get("DFO_FAULT") for n in json.loads(out)["nodes"]] == ["oom@3", "oom@3"]
    rc, out, err = dfo(capsys, p, *args, "--fault-node", "2")
    assert rc == 2 and "--fault-node 2: group pair has 2 nodes" in err and err.count("\n") == 1
    rc, out, err = dfo(capsys, p, "launch", "--host", "a", "--config", str(cfg), "--fault",
                       "oom@3", "--fault-node", "1", "--dry-run", "--no-env-check")
    assert rc == 2 and "--fault-node needs --group and --fault" in err


def test_env_missing_on_node_1_exit_7(tmp_path, capsys, tiny_assets):  # noqa: F811
    p, roots = group_yaml(tmp_path, envs=(True, False))
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    rc, out, err = dfo(capsys, p, "launch", "--group", "pair", "--config", str(cfg),
                       "--no-env-check")
    assert rc == 7 and err.count("\n") == 1
    assert "node 1 (b): no deployed env on b" in err and "dfo deploy --group pair" in err
    # status --group on the undeployed member names the group's deploy, not --host
    from dfo_contract import runstate as rs
    from orchestrator.supervisor import runfiles

    rid = "c-20261201-000000-abcdef"   # a finished run on the head
    (roots[0] / "runs" / rid).mkdir(parents=True)
    st = rs.new_state(rid, "c", now=1.0)
    st.update(status="done")
    runfiles.write_json_atomic(str(roots[0] / "runs" / rid / rs.STATE_FILE), st)
    rc, out, err = dfo(capsys, p, "status", "--group", "pair", "--run", rid)
    assert rc == 7 and "node 1 (b): no deployed env on b" in err, err
    assert "run `dfo deploy --group pair` first" in err and "--host" not in err, err


def test_lock_held_on_node_1_exit_9(tmp_path, capsys, tiny_assets):  # noqa: F811
    p, roots = group_yaml(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    (roots[1] / "locks").mkdir()
    with open(roots[1] / "locks" / "run.lock", "w") as f:
        f.write("other-run-1\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_EX)
        rc, out, err = dfo(capsys, p, "launch", "--group", "pair", "--config", str(cfg),
                           "--no-env-check")
    assert rc == 9 and err.count("\n") == 1 and "node 1 (b): run other-run-1 is live on b" in err
    assert not (roots[0] / "runs").exists()


def test_unknown_group_is_exit_2(tmp_path, capsys):
    p, _ = group_yaml(tmp_path)
    rc, out, err = dfo(capsys, p, "status", "--group", "piar")
    assert rc == 2 and "unknown group 'piar'" in err and "did you mean 'pair'" in err


@pytest.mark.slow
def test_group_run_trains_to_done_then_status_logs_and_stop(tmp_path, capsys,
                                                           tiny_assets):  # noqa: F811
    p, roots = group_yaml(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    # a short run that ends done on both nodes; logs -f follows both to the end
    rc, out, err = dfo(capsys, p, "launch", "--group", "pair", "--config", str(cfg), "--json",
                       "-f", *fast_flags())
    assert rc == 0, err
    run_id = json.loads(out.splitlines()[0])["run_id"]
    for r in roots:
        st = json.loads((r / "runs" / run_id / "state.json").read_text())
        assert st["status"] == "done", st.get("reason")
    rc, out, err = dfo(capsys, p, "status", "--group", "pair", "--run", run_id)
    rows = out.splitlines()
    assert rc == 0 and len(rows) == 4 and all(len(x) <= 80 for x in rows)
    assert rows[2].split()[:3] == ["0", "a", "done"] and rows[3].split()[:3] == ["1", "b", "done"]
    rc, out, err = dfo(capsys, p, "status", "--group", "pair", "--json")
    d = json.loads(out)
    assert d["run_id"] == run_id and [n["host"] for n in d["nodes"]] == ["a", "b"]
    rc, out, err = dfo(capsys, p, "logs", "--group", "pair", "--run", run_id)
    assert rc == 0
    assert any(ln.startswith("a | ") for ln in out.splitlines())
    assert any(ln.startswith("b | ") for ln in out.splitlines())
    assert not [ln for ln in out.splitlines() if not ln.startswith(("a | ", "b | "))]

    # a long run: stop --group stops both nodes with one checkpoint (on the head)
    cfg2 = write_config(tmp_path / "c2.yaml", tiny_assets, train={"max_steps": 2000},
                        checkpoint={"every": 1000})
    rc, out, err = dfo(capsys, p, "launch", "--group", "pair", "--config", str(cfg2), "--json",
                       *fast_flags())
    assert rc == 0, err
    rid = json.loads(out)["run_id"]
    from tests.supervisor_env import wait_for

    def steps():
        return [json.loads((r / "runs" / rid / "state.json").read_text()).get("last_step") or 0
                for r in roots]

    try:
        wait_for(lambda: steps()[0] >= 3, 240, "steps (the main rank, on the head)")
    finally:
        rc, out, err = dfo(capsys, p, "stop", "--group", "pair", "--json")
    d = json.loads(out)
    assert rc == 0 and d["run_id"] == rid, err
    assert [n["run"]["status"] for n in d["nodes"]] == ["stopped", "stopped"]
    assert d["checkpoint"] and d["checkpoint"]["step"] >= 3
    assert len(list((roots[0] / "checkpoints" / "c2").glob("step_*"))) == 1
    assert not list((roots[1] / "checkpoints" / "c2").glob("step_*"))   # only main writes


@pytest.mark.slow
def test_logs_follow_ends_10_when_the_group_run_fails(tmp_path, capsys, tiny_assets):  # noqa: F811
    p, roots = group_yaml(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    rc, out, err = dfo(capsys, p, "launch", "--group", "pair", "--config", str(cfg),
                       "--fault", "exit=1@2#*", "--budget", "crash=0", "-f", *fast_flags())
    assert rc == 10, (out, err)
    last = err.splitlines()[-1]
    assert last.startswith("dfo: error: run ") and " failed on node " in last
    assert any(ln.startswith("a | ") for ln in out.splitlines())
    assert any(ln.startswith("b | ") for ln in out.splitlines())
