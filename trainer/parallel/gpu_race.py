"""GPU check of the compile race (one H200): gate on vs off, single vs threads throughput.

    python -m trainer.parallel.gpu_race [--out DIR] [--steps N] [--budget-s 150]
        [--total-s 520] [--only gate-on,gate-off,throughput] [--smoke]

Parts (``--only``, default all, in this order):

1. ``threads`` with 3 drafter threads on cuda:0 (target on cuda:0), gate ON, a cold
   inductor/triton cache per run, 3 runs: expected no error, no hang.
2. The same with the gate OFF (the threaded lazy-compile race's unguarded pattern,
   docs/recovery.md): records whether it
   deadlocks (no step within the budget; all thread stacks dumped with faulthandler via
   SIGABRT) or raises (the FX-tracing RuntimeError) or runs.
3. ``single`` vs ``threads`` (3 drafter threads) throughput; the two share one cache and
   the first step (which compiles) is left out of the average.

Each run is a ``python -m trainer train`` subprocess bounded by ``--budget-s`` (default 150 s)
and the whole script by ``--total-s`` (default 520 s: runs that no longer fit are skipped and
reported as such), so it stays under 9 minutes even when runs hang. ``--smoke`` checks the
plumbing on CPU (tiny target, sdpa). Prints a table and writes
``summary.json`` and every run's log under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from dfo_contract import envvars
from dfo_contract.trainer_markers import StepMarker, read_marker

CONFIG = """\
model:
  target_path: {target}
  drafter_layers: {layers}
  block_size: 16
  attention: {attention}
  mask_token_id: 3
data:
  path: {data}
  max_seq_len: {seq}
  num_anchors: {anchors}
train:
  max_steps: {steps}
  micro_batch: 2
  grad_accum: 1
  log_every: 1
  heartbeat_s: 5
checkpoint:
  every: 0
  save_final: false
compile:
  enabled: true
  gate: true
parallel:
  layout: single
  target_devices: [{dev}]
  drafter_devices: [{dev}]
"""


def _run(argv, *, env, log_path, budget_s) -> dict:
    """Run argv with a wall-clock budget; on timeout dump stacks (SIGABRT) then kill."""
    t0 = time.time()
    steps: list[StepMarker] = []
    first_step: list[float] = []
    with open(log_path, "w") as log:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                             text=True, bufsize=1, start_new_session=True)

        def reader():
            for line in p.stdout or ():
                log.write(line)
                log.flush()
                m = read_marker(line)
                if isinstance(m, StepMarker):
                    steps.append(m)
                    if not first_step:
                        first_step.append(time.time() - t0)

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        timed_out = False
        try:
            p.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            p.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER=1: every thread's stack
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        th.join(timeout=10)
    text = open(log_path, errors="replace").read()
    tps = [s.tokens_per_s or 0 for s in steps[1:]]  # skip the first (compile) step
    return {
        "rc": p.returncode, "timed_out": timed_out, "seconds": round(time.time() - t0, 1),
        "first_step_s": round(first_step[0], 1) if first_step else None,
        "steps": len(steps),
        "fx_race": "symbolically trace a dynamo-optimized function" in text,
        "tokens_per_s": round(sum(tps) / len(tps), 1) if tps else None,
        "log": log_path,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "dfo_gpu_race"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=150.0, help="per run (< 3 min)")
    ap.add_argument("--total-s", type=float, default=520.0, help="whole script (< 9 min)")
    ap.add_argument("--gate-on-runs", type=int, default=3)
    ap.add_argument("--only", default="gate-on,gate-off,throughput",
                    help="comma-separated parts to run: gate-on, gate-off, throughput")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU plumbing check: tiny target, sdpa, 3 steps (no GPU needed)")
    a = ap.parse_args(argv)
    dev = "cpu" if a.smoke else "cuda:0"
    if a.smoke:
        a.steps = min(a.steps, 3)
    os.makedirs(a.out, exist_ok=True)
    py = sys.executable
    target = os.path.join(a.out, "target")
    data = os.path.join(a.out, "data.jsonl")
    seq, anchors, vocab = (64, 8, 128) if a.smoke else (1024, 32, 32000)
    if not os.path.isdir(target):
        size = [] if a.smoke else ["--hidden", "1024", "--layers", "8", "--heads", "8",
                                   "--kv-heads", "4", "--head-dim", "128",
                                   "--intermediate", "2816"]
        subprocess.run([py, "-m", "trainer.model.target", "--out", target, "--vocab", str(vocab),
                        *size], check=True)
    if not os.path.exists(data):
        subprocess.run([py, "-m", "trainer.data", "synth", "--out", data, "--num", "512",
                        "--seq-len", str(seq), "--vocab", str(vocab), "--seed", "0"], check=True)
    cfg_path = os.path.join(a.out, "race.yaml")
    with open(cfg_path, "w") as f:
        f.write(CONFIG.format(target=target, data=data, steps=a.steps, dev=dev, seq=seq,
                              anchors=anchors, attention="sdpa" if a.smoke else "flex",
                              layers=1 if a.smoke else 2))

    deadline = time.time() + a.total_s

    def run(name, extra, *, cold: bool, runs_left: int):
        cache = os.path.join(a.out, "cache-" + (name if cold else "shared"))
        if cold:
            shutil.rmtree(cache, ignore_errors=True)
        env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1",
                   NCCL_NVLS_ENABLE="0", TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"),
                   **{envvars.RUN_DIR: os.path.join(a.out, "run-" + name)})
        env.pop(envvars.FAULT, None)
        argv_ = [py, "-m", "trainer", "train", "--config", cfg_path, *extra]
        budget = min(a.budget_s, deadline - time.time() - 45.0 * (runs_left - 1))
        if budget < 30:
            r = {"name": name, "rc": None, "timed_out": None, "seconds": 0, "first_step_s": None,
                 "steps": 0, "fx_race": None, "tokens_per_s": None, "log": None,
                 "skipped": "out of the script's time budget"}
            print(f"{name:<22} skipped (time budget)", flush=True)
            return r
        r = _run(argv_, env=env, log_path=os.path.join(a.out, name + ".log"), budget_s=budget)
        r["name"], r["budget_s"] = name, round(budget)
        print(f"{name:<22} rc={r['rc']!s:<5} timeout={r['timed_out']!s:<5} "
              f"first_step={r['first_step_s']!s:<7} steps={r['steps']:<4} "
              f"fx_race={r['fx_race']!s:<5} tok/s={r['tokens_per_s']}", flush=True)
        return r

    threads = ["--parallel.layout", "threads", "--parallel.target_devices", f"[{dev}]",
               "--parallel.drafter_devices", f"[{dev},{dev},{dev}]"]
    results = []
    parts = set(a.only.split(","))
    plan = []
    if "gate-on" in parts:
        plan += [(f"threads-gate-on-{i + 1}", threads, True) for i in range(a.gate_on_runs)]
    if "gate-off" in parts:  # may hang for its whole budget
        plan.append(("threads-gate-off", threads + ["--compile.gate", "false"], True))
    if "throughput" in parts:  # warm cache, shared by the two
        plan += [("single-warm", [], False), ("threads-warm", threads, False)]
    for k, (name, extra, cold) in enumerate(plan):
        results.append(run(name, extra, cold=cold, runs_left=len(plan) - k))

    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=2)
    print()
    print("| run | rc | timed out | first step (s) | steps | FX race | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['name']} | {r['rc']} | {r['timed_out']} | {r['first_step_s']} | "
              f"{r['steps']} | {r['fx_race']} | {r['tokens_per_s']} |")
    ok = all(r["rc"] == 0 and not r["timed_out"] for r in results
             if r["name"].startswith("threads-gate-on"))
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
