"""One ddp run over two "nodes" (two torchrun agents on loopback, gloo on the CPU).

The c10d rendezvous orders nodes by their address, so giving node 1 the lower ``--local-addr``
puts node 1's process at global rank 0. The head (``DFO_NODE_RANK=0``) must still be the one
that writes metrics and checkpoints, and the only one that reads a checkpoint to resume from.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

pytest.importorskip("torch")

from dfo_contract.exitcodes import TrainerConfigError  # noqa: E402
from tests.helpers.trainer import PY, REPO, make_synth, make_target, markers, \
    tiny_overrides  # noqa: E402
from tests.lab.procs import free_port_pair  # noqa: E402

STEPS = 4
# node 1 sorts first in the rendezvous (127.0.0.1 < 127.0.0.2): it gets global rank 0
ADDR = {0: "127.0.0.2", 1: "127.0.0.1"}


def test_choose_main_is_local_rank_0_of_node_0():
    from trainer.parallel.ddp import choose_main

    assert choose_main([(None, 0), (None, 1)]) == 0                  # one node, no DFO_NODE_RANK
    assert choose_main([(1, 0), (1, 1), (0, 0), (0, 1)]) == 2        # head placed second
    assert choose_main([(0, 1), (0, 0)]) == 1
    for bad in ([(1, 0), (1, 1)], [(0, 0), (0, 0)], [(0, 0), (None, 0)]):
        with pytest.raises(TrainerConfigError, match="DFO_NODE_RANK") as e:
            choose_main(bad)
        assert "\n" not in str(e.value)


def test_node_rank_is_read_from_the_environment():
    from trainer.env import read_env

    assert read_env({}).node_rank is None and read_env({}).claims_main
    assert not read_env({"RANK": "1", "WORLD_SIZE": "2"}).claims_main
    env = read_env({"DFO_NODE_RANK": "0", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert env.node_rank == 0 and env.claims_main
    env = read_env({"DFO_NODE_RANK": "1", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert env.node_rank == 1 and not env.claims_main
    with pytest.raises(TrainerConfigError, match="DFO_NODE_RANK"):
        read_env({"DFO_NODE_RANK": "head"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("multinode")
    return make_target(str(d / "target")), make_synth(str(d / "data.jsonl"), num=48)


def _two_nodes(tiny, root, run_id: str, *extra: str) -> dict[int, subprocess.CompletedProcess]:
    """Run both nodes to the end; node n's run dir (and checkpoint dir) is ``root/nN``."""
    target, data = tiny
    port = free_port_pair()
    procs = {}
    for node in (0, 1):
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                   GLOO_SOCKET_IFNAME="lo", DFO_NODE_RANK=str(node), LOGLEVEL="INFO")
        env.pop("DFO_FAULT", None)
        args = tiny_overrides(target, data, str(root / f"n{node}"), **{
            "train.max_steps": STEPS, "train.micro_batch": 4, "checkpoint.every": 2,
            "checkpoint.keep": 5, "parallel.layout": "ddp"})
        procs[node] = subprocess.Popen(
            [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
             "--rdzv-id", run_id, "--rdzv-conf", f"is_host={1 if node == 0 else 0}",
             "--local-addr", ADDR[node], "--max-restarts", "0",
             "-m", "trainer", "train", *args, *extra],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {}
    try:
        for node, p in procs.items():
            so, se = p.communicate(timeout=240)
            out[node] = subprocess.CompletedProcess(p.args, p.returncode, so, se)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def _global_rank(stderr: str) -> int:
    """The global rank torchrun's agent gave this node's only worker (its log line)."""
    found = re.findall(r"global_ranks=\[(\d+)\]", stderr)
    assert found, stderr[-3000:]
    return int(found[-1])


def _losses(stdout: str) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in markers(stdout) if m["kind"] == "step"}


def test_head_writes_and_alone_reads_the_checkpoint_to_resume(tiny, tmp_path):
    n0, n1 = tmp_path / "n0", tmp_path / "n1"
    first = _two_nodes(tiny, tmp_path, "mn-first")
    for node, r in first.items():
        assert r.returncode == 0, (node, r.stderr[-3000:])
    assert _global_rank(first[1].stderr) == 0 and _global_rank(first[0].stderr) == 1
    # (a) the head wrote metrics and checkpoints; node 1 (global rank 0) wrote nothing
    lines = (n0 / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(1, STEPS + 1))
    assert sorted(os.listdir(n0 / "checkpoints")) == ["step_2", "step_4"]
    assert not n1.exists() or os.listdir(n1) == [], os.listdir(n1)
    assert markers(first[1].stdout) == [] and len(markers(first[0].stdout)) > 0
    want = _losses(first[0].stdout)
    assert sorted(want) == list(range(1, STEPS + 1))

    # (b) resume from step_2, which only the head has: both nodes continue from step 2 with
    # the head's weights, optimizer and data position (same losses as the unbroken run;
    # before_save's checksum at step 4 would fail on differing replicas)
    again = _two_nodes(tiny, tmp_path, "mn-resume", "--resume", "step_2")
    for node, r in again.items():
        assert r.returncode == 0, (node, r.stderr[-3000:])
    assert _global_rank(again[1].stderr) == 0
    assert not n1.exists() or os.listdir(n1) == [], os.listdir(n1)
    got = _losses(again[0].stdout)
    assert sorted(got) == [3, 4]
    assert [got[3], got[4]] == pytest.approx([want[3], want[4]], rel=1e-5, abs=1e-6)
    assert f"resumed from {n0 / 'checkpoints' / 'step_2'} at step 2" in again[0].stdout
    lines = (n0 / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4, 3, 4]
