"""engine.group_runs on two `transport: local` hosts with their own roots (the two-node
setup of docs/multinode.md on one machine): the per-node plan, and the launch-side checks
that name the node that fails (env missing: exit 7; run.lock held: exit 9; envs that
differ: exit 7), with nothing started anywhere."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys

import pytest

from orchestrator.config.hostconfig import GroupConfig, HostConfig
from orchestrator.engine.group_runs import GroupRuns
from orchestrator.engine.runs import LaunchOptions
from orchestrator.common.errors import ConfigError, DeployError, LockHeldError
from orchestrator.transport import open_transport
from tests.supervisor_env import VENV, write_config  # noqa: F401,F811
from tests.lab.procs import free_port_pair


def env_root(base, name, fingerprint=None, env=True):
    """A host root whose envs/current runs this venv's python (its own dir, so it can carry
    its own fingerprint.json)."""
    root = base / name
    (root / "envs").mkdir(parents=True)
    if env:
        e = root / "envs" / "e1"
        (e / "bin").mkdir(parents=True)
        shutil.copy(os.path.join(VENV, "pyvenv.cfg"), e / "pyvenv.cfg")
        os.symlink(os.path.join(VENV, "lib"), e / "lib")
        os.symlink(sys.executable, e / "bin" / "python")
        if fingerprint is not None:
            (e / "fingerprint.json").write_text(json.dumps(fingerprint))
        os.symlink("e1", root / "envs" / "current")
    return root


def pair(tmp_path, fps=(None, None), envs=(True, True)):
    roots = [env_root(tmp_path, n, fp, env) for n, fp, env in zip(("a", "b"), fps, envs, strict=True)]
    hosts = [HostConfig(name=n, transport="local", root=str(r), source="test")
             for n, r in zip(("a", "b"), roots, strict=True)]
    g = GroupConfig(name="pair", hosts=("a", "b"), head_addr="127.0.0.1", port=free_port_pair(),
                    ifname="lo")
    by = {h.name: h for h in hosts}
    return GroupRuns(g, hosts, lambda n: open_transport(by[n])), roots


def opts(cfg, **kw):
    kw.setdefault("dry_run", True)
    return LaunchOptions(config=str(cfg), env_check=False, **kw)


def test_plan_gives_every_node_one_run_id_its_group_spec_and_ddp(tmp_path, tiny_assets):  # noqa: F811
    gr, roots = pair(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    gp = gr.launch(opts(cfg, sets=("train.micro_batch=2",)))
    assert [n.host for n in gp.nodes] == ["a", "b"]
    assert {n.plan.run_id for n in gp.nodes} == {gp.run_id}
    for i, n in enumerate(gp.nodes):
        spec = n.plan.spec.to_json()      # as spec.json carries it
        assert spec["identity"]["run_id"] == gp.run_id
        assert spec["identity"]["root"] == str(roots[i])
        assert spec["role"]["node"] == i and spec["role"]["nodes"] == ["a", "b"]
        assert spec["role"]["env"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
        assert spec["role"]["nproc"] == 1 and spec["role"]["head_addr"] == "127.0.0.1"
        assert spec["config"]["overrides"]["parallel.layout"] == "ddp"
        assert spec["config"]["overrides"]["train.micro_batch"] == 2
        argv = n.attempt_argv
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--rdzv-endpoint") + 1] == f"127.0.0.1:{gr.group.port}"
    assert not (roots[0] / "runs").exists() and not (roots[1] / "runs").exists()
    d = gp.to_json()
    assert d["run_id"] == gp.run_id and [n["node"] for n in d["nodes"]] == [0, 1]


def test_layout_other_than_ddp_is_refused_before_any_host(tmp_path, tiny_assets):  # noqa: F811
    gr, roots = pair(tmp_path, envs=(False, False))
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    with pytest.raises(ConfigError, match="always the ddp layout"):
        gr.launch(opts(cfg, sets=("parallel.layout=single",)))


def test_env_missing_on_node_1_is_one_line_naming_it(tmp_path, tiny_assets):  # noqa: F811
    gr, roots = pair(tmp_path, envs=(True, False))
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    with pytest.raises(DeployError) as ei:
        gr.launch(opts(cfg, dry_run=False))
    msg = str(ei.value)
    assert ei.value.exit_code == 7 and "\n" not in msg
    assert "node 1 (b): no deployed env on b" in msg and "node 0" not in msg
    assert not (roots[0] / "runs").exists()


def test_lock_held_on_one_node_is_exit_9_naming_it(tmp_path, tiny_assets):  # noqa: F811
    gr, roots = pair(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    (roots[1] / "locks").mkdir()
    with open(roots[1] / "locks" / "run.lock", "w") as f:
        f.write("other-run-1\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_EX)
        with pytest.raises(LockHeldError) as ei:
            gr.launch(opts(cfg, dry_run=False))
    assert ei.value.exit_code == 9
    assert "node 1 (b): run other-run-1 is live on b" in str(ei.value)
    assert not (roots[0] / "runs").exists()


def test_envs_that_differ_name_the_host_and_how(tmp_path, tiny_assets):  # noqa: F811
    base = {"profile": "cpu", "lock_hash": "h", "dfo": "0.1.0", "python": "3.12",
            "torch": "2.11.0+cpu", "transformers": "5.17.0"}
    gr, roots = pair(tmp_path, fps=(base, {**base, "torch": "2.10.0+cpu"}))
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    with pytest.raises(DeployError) as ei:
        gr.launch(opts(cfg))
    assert str(ei.value) == ("b's env differs from a's (torch 2.10.0+cpu vs 2.11.0+cpu): "
                             "run dfo deploy --group pair")


def test_resume_is_resolved_on_the_head_only(tmp_path, tiny_assets):  # noqa: F811
    gr, roots = pair(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    from orchestrator.common.errors import NotFoundError

    with pytest.raises(NotFoundError) as ei:       # the head has no checkpoints
        gr.launch(opts(cfg, resume="latest"))
    assert "node 0 (a)" in str(ei.value) and "node 1" not in str(ei.value)


def fast(cfg, **kw):
    from tests.supervisor_env import FAST

    th = dict(FAST)
    return LaunchOptions(config=str(cfg), env_check=False, backoff_scale=0.01, thresholds=th,
                         **kw)


def test_a_node_that_fails_to_start_stops_the_started_ones(tmp_path, tiny_assets):  # noqa: F811
    gr, roots = pair(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets, train={"max_steps": 2000})
    run_id = "c-20260101-000000-abcdef"
    (roots[1] / "runs" / run_id).mkdir(parents=True)     # node 1 cannot make its run dir
    with pytest.raises(LockHeldError) as ei:
        gr.launch(fast(cfg, run_id=run_id))
    assert f"run {run_id} did not start: node 1 (b): run directory" in str(ei.value)
    info = gr.run_ops("a").status(run_id)[0]
    assert info.state.status in ("stopped", "failed", "done")


@pytest.mark.slow
def test_launch_status_logs_stop_on_two_local_nodes(tmp_path, tiny_assets):  # noqa: F811
    from orchestrator.engine.group_logs import follow_group
    from tests.supervisor_env import wait_for

    gr, roots = pair(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_assets, train={"max_steps": 2000},
                       checkpoint={"every": 3})
    gp = gr.launch(fast(cfg))
    rid = gp.run_id
    try:
        for r in roots:
            spec = json.loads((r / "runs" / rid / "spec.json").read_text())
            assert spec["role"]["nodes"] == ["a", "b"] and spec["identity"]["run_id"] == rid
        wait_for(lambda: (gr.status(rid)[1][0].value.state.last_step or 0) >= 2,
                 240, "steps (the main rank, on the head)")
        got, outs = gr.status()
        assert got == rid and [o.host for o in outs] == ["a", "b"] and all(o.ok for o in outs)
        lines: list[tuple[str, str]] = []
        res = follow_group([(h.name, gr.run_ops(h.name).transport, gr.run_ops(h.name).tree)
                            for h in gr.hosts], rid,
                           on_line=lambda host, ln: lines.append((host, ln.file)))
        assert all(o.ok for o in res)
        assert {h for h, f in lines if f == "events.jsonl"} == {"a", "b"}
    finally:
        got, outs = gr.stop(rid, timeout=120)
    assert got == rid and all(o.ok for o in outs), [o.error for o in outs]
    assert [o.value.run.state.status for o in outs] == ["stopped", "stopped"]
    assert (ck := outs[0].value.run.state.last_checkpoint) and ck.step is not None


def test_a_member_without_a_fingerprint_differs_from_a_head_with_one(tmp_path, tiny_assets):  # noqa: F811
    fp = {"profile": "cpu", "torch": "2.11.0+cpu"}
    gr, roots = pair(tmp_path, fps=(fp, None))
    cfg = write_config(tmp_path / "c.yaml", tiny_assets)
    with pytest.raises(DeployError, match="no env deployed on b: run dfo deploy --group pair"):
        gr.launch(opts(cfg))
