"""Two real supervisors as the two nodes of one run on this machine (two roots, one GPU each
with --device cuda: nccl; gloo on CPU), coordinating through the head's TCPStore on
loopback: (1) a run trains to done; (2) a fault on node 1 restarts the whole run once with
the fallback, both nodes resuming the head's checkpoint. The CPU version of the same is
tests/test_group_supervisor.py.

    python3 bench/group_supervisor.py --device cuda --out "$OUT"    # needs 2 GPUs

Writes ``summary.json`` and each node's run dir (events, attempt logs) under ``--out``.
Exit 0 when every check held.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import yaml  # noqa: E402

from dfo_contract.runspec import Bundled, Config, Identity, Resume, RunSpec  # noqa: E402
from orchestrator.common.launch_argv import supervisor_argv  # noqa: E402
from orchestrator.common.launch_argv import flatten  # noqa: E402
from orchestrator.plan.thresholds import thresholds as thresholds_of  # noqa: E402
from orchestrator.common.budget import BudgetPolicy  # noqa: E402
from orchestrator.common.fallback import merge_ladders  # noqa: E402
from orchestrator.common.group import GroupSpec  # noqa: E402
from orchestrator.config.host_tree import HostTree  # noqa: E402

HOSTS = ("node0", "node1")
FAST = {"warmup_s": 300, "train_s": 60, "live_grace_s": 2, "kill_grace_s": 5,
        "stop_timeout_s": 60, "poll_s": 0.1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(work: str, name: str, cfg: dict, device: str, faults, timeout: float) -> dict:
    run_id = f"{name}-{int(time.time())}"
    port, coord = free_port(), free_port()
    dirs, procs = [], []
    for k, host in enumerate(HOSTS):
        root = os.path.join(work, name, host)
        tree = HostTree(root)
        run_dir = tree.run_dir(run_id)
        os.makedirs(run_dir)
        with open(os.path.join(run_dir, "config.yaml"), "w") as f:
            yaml.safe_dump(cfg, f)
        env = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
        if device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = str(k)
        gs = GroupSpec(name="pair", nodes=HOSTS, node=k, head_addr="127.0.0.1", port=port,
                       coord_port=coord, nproc=1, env=env, node_lost_s=20.0)
        spec = RunSpec(
            identity=Identity(run_id=run_id, run_name=name, host=host, root=root,
                              python=sys.executable, lock=tree.run_lock),
            config=Config(path=os.path.join(run_dir, "config.yaml"), base=flatten(cfg)),
            resume=Resume(checkpoint_dir=tree.checkpoints(name)),
            thresholds=thresholds_of(FAST), budget=BudgetPolicy(scale=0.01),
            ladders={k: tuple(v) for k, v in merge_ladders().items()},
            trainer=Bundled(fault=faults[k]), role=gs)
        with open(os.path.join(run_dir, "spec.json"), "w") as f:
            json.dump(spec.to_json(), f)
        dirs.append(run_dir)
    penv = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    t0 = time.time()
    for d in dirs:
        log = open(os.path.join(d, "supervisor.log"), "ab")
        procs.append(subprocess.Popen(supervisor_argv(sys.executable, d),
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                      env=penv, cwd=d, start_new_session=True))
    deadline = time.time() + timeout
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(1)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, 9)
    out = {"run_id": run_id, "wall_s": round(time.time() - t0, 1), "nodes": []}
    for d in dirs:
        st = json.load(open(os.path.join(d, "state.json")))
        evs = [json.loads(ln) for ln in open(os.path.join(d, "events.jsonl")) if ln.strip()]
        out["nodes"].append({
            "status": st.get("status"), "reason": st.get("reason"),
            "last_step": st.get("last_step"), "overrides": st.get("overrides"),
            "starts": [{"resume": e.get("resume"), "overrides": e.get("overrides")}
                       for e in evs if e["kind"] == "attempt_start"],
            "decisions": [{"action": e.get("action"), "cause": (e.get("cause") or {}).get("class")}
                          for e in evs if e["kind"] == "group_decision"],
            "run_dir": d})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/dfo-group-bench")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    from trainer.data.synth import write_synth
    from trainer.model.target import make_tiny_target

    target = make_tiny_target(os.path.join(a.work, "target"), layers=4)
    data = write_synth(os.path.join(a.work, "data.jsonl"), num=256, seq_len=64, vocab=128, seed=0)
    cfg = yaml.safe_load(open(os.path.join(REPO, "orchestrator/config/defaults/tiny-cpu.yaml")))
    cfg.pop("run", None)
    cfg["model"]["target_path"] = str(target)
    cfg["data"]["path"] = str(data)
    cfg["train"].update({"max_steps": 12, "log_every": 1, "heartbeat_s": 1.0})
    cfg["checkpoint"].update({"every": 4, "keep": 5})
    dev = ["cuda:0"] if a.device == "cuda" else ["cpu"]
    cfg["parallel"].update({"layout": "ddp", "target_devices": dev, "drafter_devices": dev})
    res = {"device": a.device}
    res["done"] = run_group(a.work, "gdone", cfg, a.device, (None, None), 600)
    res["fault"] = run_group(a.work, "gfault", cfg, a.device, (None, "fx_race@6"), 900)
    d, f = res["done"]["nodes"], res["fault"]["nodes"]
    checks = {
        "done_both": [n["status"] for n in d] == ["done", "done"] and d[0]["last_step"] == 12,
        "fault_both_done": [n["status"] for n in f] == ["done", "done"],
        "fault_one_restart": [len(n["starts"]) for n in f] == [2, 2],
        "fault_same_resume": len(f[0]["starts"]) == 2 and f[0]["starts"][1] == f[1]["starts"][1],
        "fault_cause": bool(f[0]["decisions"]) and f[0]["decisions"][0]["cause"] == "fx_trace_race",
    }
    res["checks"] = checks
    res["ok"] = all(checks.values())
    for name in ("gdone", "gfault"):
        shutil.copytree(os.path.join(a.work, name), os.path.join(a.out, name),
                        ignore=shutil.ignore_patterns("checkpoints", "cache", "envs"),
                        dirs_exist_ok=True)
    with open(os.path.join(a.out, "summary.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(json.dumps({"ok": res["ok"], "checks": checks,
                      "wall_s": [res["done"]["wall_s"], res["fault"]["wall_s"]]}))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
