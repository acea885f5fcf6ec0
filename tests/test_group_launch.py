"""plan.group_launch: the pure parts of `dfo launch --group` (per-node GroupSpec, the forced
ddp layout, the env-fingerprint comparison, the per-node torchrun argv) and the 80-column
rows of `dfo status --group`."""

from __future__ import annotations

import pytest

from dfo_contract.codec import encode

from orchestrator.cli.group_run import status_lines
from orchestrator.config.hostconfig import GpuLayout, GroupConfig, HostConfig
from orchestrator.common.errors import ConfigError, DeployError, LockHeldError
from orchestrator.plan import group_launch as gl


def hosts():
    return [HostConfig(name="gpu1", transport="local", root="/r1",
                       gpus=GpuLayout(target=("cuda:0",), drafter=("cuda:0", "cuda:1", "cuda:1"))),
            HostConfig(name="gpu2", transport="local", root="/r2")]


def group(**kw):
    d = dict(name="pair", hosts=("gpu1", "gpu2"), head_addr="10.0.0.1", port=29400)
    d.update(kw)
    return GroupConfig(**d)


def test_specs_per_node_head_first_nproc_and_env():
    specs = gl.group_specs(group(ifname="eth1", gpus={"gpu2": ("cuda:2", "cuda:3")}), hosts())
    head, peer = specs
    assert (head.node, head.is_head, head.nnodes, head.coord_port) == (0, True, 2, 29401)
    assert head.nproc == 2           # the host's drafter devices: two distinct cuda devices
    assert head.env == {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "eth1"}
    assert peer.nproc == 2 and peer.host == "gpu2"
    assert peer.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert encode(peer)["node"] == 1 and encode(peer)["kind"] == "group"


def test_cpu_node_runs_one_process_and_no_ifname_no_env():
    specs = gl.group_specs(group(), hosts())
    assert specs[1].nproc == 1 and specs[1].env == {}
    specs = gl.group_specs(group(gpus={"gpu2": ("cpu", "cpu")}), hosts())
    assert specs[1].nproc == 2 and "CUDA_VISIBLE_DEVICES" not in specs[1].env
    with pytest.raises(ValueError):
        gl.group_specs(group(), list(reversed(hosts())))


def test_layout_is_forced_to_ddp_and_another_is_refused():
    assert gl.group_sets(["train.micro_batch=4"]) == ["train.micro_batch=4", "parallel.layout=ddp"]
    assert gl.group_sets(["parallel.layout=ddp"]) == ["parallel.layout=ddp"]
    with pytest.raises(ConfigError, match="parallel.layout=single.*always the ddp layout"):
        gl.group_sets(["parallel.layout=single"])


def test_nodes_error_keeps_the_first_failing_nodes_exit_code():
    e = gl.nodes_error([(1, "gpu2", "no deployed env on gpu2 (run dfo deploy)", 7)], "cannot launch")
    assert isinstance(e, DeployError) and e.exit_code == 7
    assert str(e) == "cannot launch: node 1 (gpu2): no deployed env on gpu2 (run dfo deploy)"
    e = gl.nodes_error([(0, "a", "x", 9), (1, "b", "y", 7)], "w")
    assert isinstance(e, LockHeldError) and "node 0 (a): x; node 1 (b): y" in str(e)


def test_node_attempt_argv_is_torchrun_c10d_per_node():
    head, peer = gl.group_specs(group(), hosts())
    kw = dict(run_dir="/r/runs/x", checkpoint_dir="/r/checkpoints/x", resume="/r1/ck/step_4",
              run_id="x-1")
    a0 = gl.node_attempt_argv("/py", "/c.yaml", {"parallel.layout": "ddp"}, spec=head, **kw)
    a1 = gl.node_attempt_argv("/py", "/c.yaml", {"parallel.layout": "ddp"}, spec=peer,
                              attempt=3, **kw)
    assert a0[:3] == ["/py", "-m", "torch.distributed.run"]
    assert a0[a0.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert a0[a0.index("--rdzv-id") + 1] == "x-1-a1" and a1[a1.index("--rdzv-id") + 1] == "x-1-a3"
    assert "is_host=1" in a0 and "is_host=1" not in a1
    assert a0[a0.index("--nproc-per-node") + 1] == "2" and a1[a1.index("--nproc-per-node") + 1] == "1"
    i = a1.index("orchestrator.supervisor.shim")
    assert a1[i:i + 3] == ["orchestrator.supervisor.shim", "trainer", "train"]
    assert "--parallel.layout=ddp" in a1 and a1[-2:] == ["--resume", "/r1/ck/step_4"]


def test_status_lines_fit_80_columns():
    rows = [{"node": 0, "host": "gpu1", "state": "running", "attempt": "2", "step": "120",
             "last_event": "restart after fx_trace_race with fallback compile_gate " * 3},
            {"node": 1, "host": "gpu2", "state": "error", "attempt": "-", "step": "-",
             "last_event": "cannot reach gpu2"}]
    lines = status_lines("pair", "r-1", rows)
    assert len(lines) == 4 and all(len(ln) <= 80 for ln in lines)
    assert lines[2].split()[:5] == ["0", "gpu1", "running", "2", "120"] and lines[2].endswith("…")
    assert lines[3].split()[:3] == ["1", "gpu2", "error"]
