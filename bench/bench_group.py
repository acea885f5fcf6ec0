"""Two "nodes" on one machine vs one node: the same config, ddp layout.

    python3 bench/bench_group.py --out $OUT            # 2 GPUs: node a = cuda:0, node b = cuda:1
    python3 bench/bench_group.py --cpu-smoke --out /tmp/dfo_group_cpu   # checks this script

Two hosts with ``transport: local`` and their own roots under ``--out`` (``envs/current`` is
this interpreter's prefix), a group with ``head_addr 127.0.0.1`` and ``ifname lo``; each
node gets one GPU (``gpus:``, so ``CUDA_VISIBLE_DEVICES`` differs per node). First one node
(``dfo launch`` on host a, ddp with one process), then the group (``dfo launch --group``,
two nodes of one process each, c10d rendezvous on loopback, gloo/NCCL over lo). Each run
goes to ``--steps`` and ends ``done``. Prints and writes ``summary.json``: each run's status,
its median tokens/s over the steps after the first ``--skip`` (the main rank's step
markers; tokens of all ranks), the launch-to-first-step time, and the scaling ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from dfo_contract.markers import iter_markers  # noqa: E402

#: the GPU run: a 2-layer drafter, sdpa, eager, the ddp layout on one GPU per node
GPU_SETTINGS = {"model.drafter_layers": 2, "model.block_size": 16, "model.attention": "sdpa",
                "model.mask_token_id": 3, "data.max_seq_len": 1024, "data.num_anchors": 32,
                "train.micro_batch": 4, "train.grad_accum": 1, "train.log_every": 1,
                "train.heartbeat_s": 5, "checkpoint.every": 100000, "checkpoint.keep": 1,
                "compile.enabled": False, "compile.gate": False, "parallel.layout": "ddp",
                "parallel.target_devices": ["cuda:0"], "parallel.drafter_devices": ["cuda:0"]}


def config_text(target: str, data: str, steps: int, cpu: bool) -> str:
    from run_config import run_config_yaml

    common = {"model.target_path": target, "data.path": data, "train.max_steps": steps}
    if not cpu:
        return run_config_yaml({**GPU_SETTINGS, **common})
    return run_config_yaml({**common, "train.log_every": 1, "train.heartbeat_s": 1.0,
                            "checkpoint.every": 100000, "parallel.layout": "ddp"}, base="tiny-cpu")


def root_for(out: Path, name: str) -> Path:
    root = out / name
    (root / "envs").mkdir(parents=True, exist_ok=True)
    cur = root / "envs" / "current"
    if not cur.exists():   # "the deployed env": this interpreter's (as bench_own.py does)
        if os.path.exists(os.path.join(sys.prefix, "bin", "python")):
            os.symlink(sys.prefix, cur)
        else:              # a system python3 without a `python` name
            (cur / "bin").mkdir(parents=True)
            os.symlink(sys.executable, cur / "bin" / "python")
    return root


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(run_dir: Path, skip: int) -> dict:
    state = json.loads((run_dir / "state.json").read_text())
    steps = []
    for a in state.get("attempts") or []:
        log = run_dir / a["log"]
        if log.exists():
            steps += [m for m in iter_markers(log.read_text(errors="replace").splitlines())
                      if m.get("kind") == "step"]
    tps = [m["tokens_per_s"] for m in steps[skip:] if m.get("tokens_per_s")]
    first = steps[0]["t"] - state["started_at"] if steps and state.get("started_at") else None
    return {"status": state.get("status"), "reason": state.get("reason"),
            "attempts": len(state.get("attempts") or []), "steps": len(steps),
            "median_tokens_per_s": round(statistics.median(tps), 1) if tps else None,
            "launch_to_first_step_s": round(first, 1) if first is not None else None}


def wait_final(run_ops, run_id: str, deadline: float):
    while time.time() < deadline:
        info = run_ops.status(run_id)[0]
        if info.state.final:
            return info
        time.sleep(2)
    print(f"time budget spent: stopping {run_id}", flush=True)
    run_ops.stop(run_id, timeout=90)
    return run_ops.status(run_id)[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/dfo_group")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--skip", type=int, default=5, help="steps left out of the median")
    ap.add_argument("--total-s", type=float, default=540.0, help="give up after (< 10 min)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny CPU run (checks this script)")
    a = ap.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    from bench_recovery import make_assets

    target, data = make_assets(out, a.cpu_smoke)
    cfg = out / "group.yaml"
    cfg.write_text(config_text(target, data, a.steps, a.cpu_smoke))

    from orchestrator.config.hostconfig import GpuLayout, GroupConfig, HostConfig
    from orchestrator.engine.group_runs import GroupRuns
    from orchestrator.engine.runs import LaunchOptions, RunOps
    from orchestrator.transport.local import LocalTransport

    dev = ("cpu",) if a.cpu_smoke else ("cuda:0",)
    hosts = [HostConfig(name=n, transport="local", root=str(root_for(out, n)), source="bench",
                        gpus=GpuLayout(target=dev, drafter=dev)) for n in ("a", "b")]
    gpus = {} if a.cpu_smoke else {"a": ("cuda:0",), "b": ("cuda:1",)}
    group = GroupConfig(name="pair", hosts=("a", "b"), head_addr="127.0.0.1", port=free_port(),
                        gpus=gpus, ifname="lo")
    th = {"warmup_s": 300, "train_s": 120, "stop_timeout_s": 60}
    t0 = time.time()
    deadline = t0 + a.total_s
    res: dict = {"steps": a.steps, "config": cfg.read_text()}

    one = RunOps(LocalTransport("a"), hosts[0], say=print)
    plan = one.launch(LaunchOptions(config=str(cfg), run_name="one", new_lineage=True,
                                    env_check=False, thresholds=th, backoff_scale=0.1))
    print(f"one node: {plan.run_id}", flush=True)
    wait_final(one, plan.run_id, t0 + a.total_s / 2)
    res["one_node"] = measure(Path(plan.run_dir), a.skip)
    print(json.dumps(res["one_node"]), flush=True)

    gr = GroupRuns(group, hosts, lambda n: LocalTransport(n), say=print)
    gp = gr.launch(LaunchOptions(config=str(cfg), run_name="two", new_lineage=True,
                                 env_check=False, thresholds=th, backoff_scale=0.1))
    print(f"two nodes: {gp.run_id}", flush=True)
    wait_final(gr.run_ops("a"), gp.run_id, deadline)
    time.sleep(3)
    _, outs = gr.status(gp.run_id)
    res["two_nodes"] = {"head": measure(Path(gp.nodes[0].plan.run_dir), a.skip),
                        "nodes": [{"host": o.host, "status": o.value.state.status if o.ok else None,
                                   "error": o.error} for o in outs]}
    one_t = res["one_node"]["median_tokens_per_s"]
    two_t = res["two_nodes"]["head"]["median_tokens_per_s"]
    res["scaling"] = round(two_t / one_t, 3) if one_t and two_t else None
    res["wall_s"] = round(time.time() - t0, 1)
    (out / "summary.json").write_text(json.dumps(res, indent=2))
    print()
    print("| run | status | median tok/s | launch -> first step (s) |")
    print("|---|---|---|---|")
    o, h = res["one_node"], res["two_nodes"]["head"]
    print(f"| 1 node x 1 GPU | {o['status']} | {o['median_tokens_per_s']} | "
          f"{o['launch_to_first_step_s']} |")
    print(f"| 2 nodes x 1 GPU | {h['status']} | {h['median_tokens_per_s']} | "
          f"{h['launch_to_first_step_s']} |")
    print(f"scaling {res['scaling']}; wall {res['wall_s']} s")
    return 0 if o["status"] == "done" and h["status"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
