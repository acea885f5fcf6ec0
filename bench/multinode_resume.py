"""Two "nodes" of one ddp run on this machine (two torchrun agents, rendezvous on loopback),
node 1 placed at global rank 0; checks that only the head (DFO_NODE_RANK=0) writes and that
a resume from a checkpoint only the head has continues both nodes alike.

    python3 bench/multinode_resume.py --device cuda --out "$OUT"   # 2 GPUs: nccl, one each
    python3 bench/multinode_resume.py --device cpu --out /tmp/x     # gloo (as the test)

Writes ``summary.json`` (ranks, losses, files, pass/fail) and the nodes' logs to ``--out``.
Exit 0 when every check held. tests/test_trainer_multinode.py is the CPU test of the same.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from dfo_contract.markers import iter_markers  # noqa: E402

ADDR = {0: "127.0.0.2", 1: "127.0.0.1"}  # node 1 sorts first: global rank 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def overrides(target, data, run_dir, device, steps) -> list[str]:
    dev = "[cpu]" if device == "cpu" else "[cuda]"
    kv = {"model.target_path": target, "model.drafter_layers": 1, "model.block_size": 8,
          "model.attention": "sdpa", "data.path": data, "data.max_seq_len": 64,
          "data.num_anchors": 8, "train.micro_batch": 4, "train.max_steps": steps,
          "train.lr": 3e-3, "train.log_every": 1, "compile.enabled": "false",
          "compile.gate": "false", "run.dir": run_dir, "parallel.target_devices": dev,
          "parallel.drafter_devices": dev, "parallel.layout": "ddp", "checkpoint.every": 2,
          "checkpoint.keep": 5, "model.dtype": "fp32"}
    return [x for k, v in kv.items() for x in (f"--{k}", str(v))]


def two_nodes(root, target, data, device, steps, run_id, extra, timeout=480):
    port = free_port()
    procs = {}
    for node in (0, 1):
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", LOGLEVEL="INFO",
                   GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo", NCCL_NVLS_ENABLE="0",
                   DFO_NODE_RANK=str(node), PYTHONPATH=REPO)
        if device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = str(node)
        procs[node] = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
             "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
             "--rdzv-conf", f"is_host={1 if node == 0 else 0}", "--local-addr", ADDR[node],
             "--max-restarts", "0", "-m", "trainer", "train",
             *overrides(target, data, os.path.join(root, f"n{node}"), device, steps), *extra],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    res = {}
    try:
        for node, p in procs.items():
            so, se = p.communicate(timeout=timeout)
            res[node] = (p.returncode, so, se)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return res


def losses(stdout):
    return {m["step"]: m["loss"] for m in iter_markers(stdout.splitlines()) if m["kind"] == "step"}


def global_rank(stderr):
    found = re.findall(r"global_ranks=\[(\d+)\]", stderr)
    return int(found[-1]) if found else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/dfo_multinode_out"))
    ap.add_argument("--work", default="/tmp/dfo_multinode_work")
    a = ap.parse_args()
    import shutil

    import torch

    if a.device == "cuda" and torch.cuda.device_count() < 2:
        print("multinode_resume: --device cuda needs 2 GPUs (NCCL refuses two ranks on one GPU)")
        return 2

    from trainer.data.synth import write_synth
    from trainer.model.target import make_tiny_target

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    os.makedirs(a.out, exist_ok=True)
    target = make_tiny_target(os.path.join(a.work, "target"), layers=4)
    data = write_synth(os.path.join(a.work, "data.jsonl"), num=48, seq_len=64, vocab=128, seed=0)
    summary: dict = {"device": a.device, "checks": {}}
    t0 = time.time()
    first = two_nodes(a.work, target, data, a.device, 4, "mn-first", [])
    summary["first_s"] = round(time.time() - t0, 1)
    t0 = time.time()
    again = two_nodes(a.work, target, data, a.device, 4, "mn-resume", ["--resume", "step_2"])
    summary["resume_s"] = round(time.time() - t0, 1)
    for name, res in (("first", first), ("resume", again)):
        for node, (rc, so, se) in res.items():
            with open(os.path.join(a.out, f"{name}-node{node}.log"), "w") as f:
                f.write(f"exit {rc}\n--- stdout\n{so}\n--- stderr\n{se[-200000:]}")
    n0, n1 = os.path.join(a.work, "n0"), os.path.join(a.work, "n1")
    want, got = losses(first[0][1]), losses(again[0][1])
    c = summary["checks"]
    c["exit_codes"] = [first[0][0], first[1][0], again[0][0], again[1][0]]
    c["ranks_first"] = {n: global_rank(first[n][2]) for n in (0, 1)}
    c["ranks_resume"] = {n: global_rank(again[n][2]) for n in (0, 1)}
    c["head_checkpoints"] = sorted(os.listdir(os.path.join(n0, "checkpoints"))) \
        if os.path.isdir(os.path.join(n0, "checkpoints")) else []
    c["node1_files"] = sorted(os.listdir(n1)) if os.path.isdir(n1) else []
    c["losses_first"], c["losses_resume"] = want, got
    tol = 1e-5 if a.device == "cpu" else 1e-3  # GPU kernels may reduce in another order
    ok = (c["exit_codes"] == [0, 0, 0, 0] and c["ranks_first"][1] == 0
          and c["head_checkpoints"] == ["step_2", "step_4"] and not c["node1_files"]
          and sorted(got) == [3, 4]
          and all(abs(got[s] - want[s]) <= tol * max(1.0, abs(want[s])) for s in (3, 4)))
    summary["ok"] = ok
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    print(json.dumps(summary, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
