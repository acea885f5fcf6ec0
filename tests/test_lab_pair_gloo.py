"""torch.distributed across the lab pair (containers 202 and 203 on the pair network):
the cpu env deployed into both by dfo's Deployer (offline, from the wheelhouse), then
a gloo all_reduce over mn0 with the TCPStore on the head's 10.77.0.1, and the same
through torchrun's c10d rendezvous (what a multi-node launch runs)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from orchestrator.config.inventory import load_inventory
from orchestrator.engine.deploy import Deployer
from orchestrator.engine.wheel import build as build_wheel
from orchestrator.transport import open_transport
from tests.helpers.wheelhouse import fill_wheelhouse
from tests.lab.pair import PairInfo

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

ROOT = "/root/dfo-pair-test"

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

TRAIN = r"""
import os, socket
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} on {socket.gethostname()} sum {t.item():g}")
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def _deploy_state(tmp_path_factory):
    """Per module: dfo's wheel (built once) and the transports that got a deploy, whose
    roots are removed at module end."""
    state = {"wheel": None, "transports": [], "base": tmp_path_factory.mktemp("pair-gloo")}
    yield state
    for t in state["transports"]:
        t.run(["rm", "-rf", ROOT], timeout=300)  # ~1 GB of env + uv cache per container
        t.close()


@pytest.fixture
def deployed_pair(lab_pair: PairInfo, _deploy_state):
    """The cpu env in both containers (the first test deploys, later ones find it: a no-op)."""
    st = _deploy_state
    first = st["wheel"] is None
    if first:
        fill_wheelhouse(Path(lab_pair.lab.wheelhouse_host_dir))
        st["wheel"] = build_wheel(st["base"] / "cache")
    hosts = st["base"] / "hosts.yaml"
    hosts.write_text(lab_pair.hosts_yaml(root=ROOT, groups=False, wheelhouse=True))
    inv = load_inventory(str(hosts))
    for t in st["transports"]:
        t.close()
    st["transports"] = []
    for name in lab_pair.host_names:
        host = inv.get(name)
        t = open_transport(host)
        st["transports"].append(t)
        if first:  # the first test of this module starts from an empty root
            t.run(["rm", "-rf", ROOT], timeout=120, check=True)
        Deployer(t, host, wheel=st["wheel"]).deploy()
    return lab_pair, list(st["transports"])


def _both(ts, argvs, env):
    """Run argvs[i] on ts[i] at the same time; the results in order."""
    res = [None, None]

    def go(i):
        res[i] = ts[i].run(argvs[i], env=env, timeout=300)

    th = threading.Thread(target=go, args=(0,))
    th.start()
    go(1)
    th.join(330)
    return res


def test_gloo_all_reduce_across_the_pair(deployed_pair):
    pair, ts = deployed_pair
    py = f"{ROOT}/envs/current/bin/python"
    argvs = [[py, "-c", ALL_REDUCE, str(rank), pair.head_addr, "29500"] for rank in (0, 1)]
    head, peer = _both(ts, argvs, {"GLOO_SOCKET_IFNAME": pair.ifname})
    assert head.ok, head.err
    assert peer.ok, peer.err
    assert head.out.strip() == "rank 0 on dfo-lab-202 sum 3"
    assert peer.out.strip() == "rank 1 on dfo-lab-203 sum 3"


def test_torchrun_c10d_rendezvous_across_the_pair(deployed_pair):
    """What `dfo launch --group` runs per node. Two flags are needed here, as on any
    cluster whose hostnames do not resolve to the rendezvous network (each container's
    /etc/hosts maps its own name to 127.0.1.1; neither knows the other's name):
    ``--rdzv-conf is_host=1`` on the head, ``=0`` elsewhere (else torchrun decides by
    hostname lookup, finds 10.77.0.1 is not "this host", and nobody hosts the store:
    every agent times out connecting), and ``--local-addr`` = the node's own address
    (else rank 0 advertises its hostname as the master address and the workers hang)."""
    pair, ts = deployed_pair
    torchrun = f"{ROOT}/envs/current/bin/torchrun"
    argvs = [[torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"{pair.head_addr}:{pair.port}", "--rdzv-id", "lab-pair-test",
              "--rdzv-conf", f"is_host={int(i == 0)}", "--local-addr", addr,
              "--max-restarts", "0", "-m", "dfo_lab_probe"]
             for i, addr in enumerate(pair.addresses)]
    # the probe as a module file in each container (torchrun runs a script or -m)
    for t in ts:
        t.run(["mkdir", "-p", f"{ROOT}/probe"], timeout=60, check=True)
        t.put(TRAIN.encode(), f"{ROOT}/probe/dfo_lab_probe.py")
    env = {"GLOO_SOCKET_IFNAME": pair.ifname, "PYTHONPATH": f"{ROOT}/probe"}
    head, peer = _both(ts, argvs, env)
    assert head.ok, head.err[-3000:]
    assert peer.ok, peer.err[-3000:]
    # the rendezvous, not the node order, hands out the ranks
    (h,), (p,) = head.out.strip().splitlines(), peer.out.strip().splitlines()
    assert {h[:8], p[:8]} == {"rank 0/2", "rank 1/2"}
    assert h.endswith(" on dfo-lab-202 sum 3") and p.endswith(" on dfo-lab-203 sum 3")
