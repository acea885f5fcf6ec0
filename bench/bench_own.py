"""Supervise your own trainer on a GPU: ``dfo launch -- CMD`` around your own script
(bench/own_flex_threads.py: several threads each lazily compiling flex_attention fwd+bwd
for new shapes on a cold cache) and record how failures were detected and recovered.

    python bench/bench_own.py --out $OUT/own [--threads 4] [--total-s 500]
    python bench/bench_own.py --out /tmp/own_cpu --cpu-smoke        # plumbing check on CPU

The supervisor sees only the script's output (a --step-pattern) and its process tree's
CPU time; the run file's ladder, per failure class: run the script's own single-threaded
warm-up first (fills the compile cache), then --threads 1. Prints the attempts and, per
recovery, detection (failure seen -> classified; for a silent hang from the last step
line), restart (classified -> next attempt), to first step and failure -> healthy
(first step at >= 50% of the best tokens/s) as markdown rows; writes summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PATTERN = r"step (?P<step>\d+) loss \S+ tok/s (?P<tok_s>[\d.]+)"
STEP = re.compile(PATTERN)


def run_file(out: Path, script: str, threads: int, device: str, cache: Path) -> str:
    warm = ["python", script, "--warm-only", "--threads", "1", "--device", device,
            "--ckpt", str(out / "ckpt")]
    ladder = f"""\
    - run_first: {json.dumps(warm)}
    - set_arg: {{--threads: 1}}
"""
    return (f"step_pattern: '{PATTERN}'\n"
            f"cwd: {out}\n"
            f"env: {{TORCHINDUCTOR_CACHE_DIR: '{cache}/inductor', TRITON_CACHE_DIR: '{cache}/triton'}}\n"
            "resume: {glob: 'ckpt/step_*', order: step, args: [--resume, '{path}']}\n"
            "fallbacks:\n"
            + "".join(f"  {cls}:\n{ladder}" for cls in
                      ("fx_trace_race", "compile_hang", "dense_fallback", "crash")))


def analyse(run_dir: Path) -> dict:
    evs = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines() if ln]
    state = json.loads((run_dir / "state.json").read_text())
    attempts = []
    for a in state["attempts"]:
        text = (run_dir / a["log"]).read_text(errors="replace") if a.get("log") else ""
        toks = [float(m.group("tok_s")) for m in STEP.finditer(text)]
        attempts.append({"n": a["n"], "overrides": a["overrides"], "class": a.get("cls"),
                         "reason": a.get("reason"), "exit_code": a.get("exit_code"),
                         "signal": a.get("signal"), "steps": len(toks),
                         "started_at": a["started_at"], "ended_at": a.get("ended_at"),
                         "tokens_per_s": toks})
    best = max((x for a in attempts for x in a["tokens_per_s"]), default=None)
    rec = []
    for i, a in enumerate(attempts[:-1]):
        nxt = attempts[i + 1]
        cl = next(e for e in evs if e.get("attempt") == a["n"] and e["kind"] == "classified")
        wd = [e for e in evs if e.get("attempt") == a["n"] and e["kind"] == "watchdog"]
        seen = wd[0]["t"] if wd else a["ended_at"]
        hang = [e for e in wd if "without progress" in e["reason"]]
        if hang:   # from the moment it went silent: the hang threshold is part of detection
            m = re.search(r"^(\d+)s without progress", hang[0]["reason"])
            seen = hang[0]["t"] - (float(m.group(1)) if m else 0.0)
        start2 = next((e["t"] for e in evs if e["kind"] == "attempt_start"
                       and e.get("attempt") == nxt["n"]), nxt["started_at"])
        rec.append({"attempt": a["n"], "class": cl["class"],
                    "detection_s": round(cl["t"] - seen, 1),
                    "restart_s": round(start2 - cl["t"], 1),
                    "fallback": next((e.get("step") for e in evs if e["kind"] == "fallback"
                                      and e.get("attempt") == a["n"]), None)})
    return {"status": state["status"], "reason": state["reason"], "overrides": state["overrides"],
            "best_tokens_per_s": best, "attempts": attempts, "recoveries": rec,
            "events": [e for e in evs if e["kind"] in ("watchdog", "classified", "fallback",
                                                       "run_first", "restart", "final",
                                                       "throughput_low")]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/dfo_own")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--total-s", type=float, default=500.0, help="give up after (< 10 min)")
    ap.add_argument("--hang-s", type=float, default=45.0)
    ap.add_argument("--cpu-smoke", action="store_true")
    a = ap.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = out / "root"
    cur = root / "envs" / "current"
    (root / "envs").mkdir(parents=True, exist_ok=True)
    if not cur.exists():   # "the deployed env": this interpreter's (a venv keeps its pyvenv.cfg)
        if os.path.exists(os.path.join(sys.prefix, "bin", "python")):
            os.symlink(sys.prefix, cur)
        else:              # a system python3 without a `python` name
            (cur / "bin").mkdir(parents=True)
            os.symlink(sys.executable, cur / "bin" / "python")
    cache = out / f"cache-{int(time.time())}"          # cold
    device = "cpu" if a.cpu_smoke else "cuda"
    script = str(REPO / "bench" / "own_flex_threads.py")
    rf = out / "own.yaml"
    rf.write_text(run_file(out, script, a.threads, device, cache))

    from orchestrator.config.inventory import HostConfig
    from orchestrator.engine.runs import LaunchOptions, RunOps
    from orchestrator.transport.local import LocalTransport

    host = HostConfig(name="local", transport="local", root=str(root), source="bench")
    run_ops = RunOps(LocalTransport("local"), host, say=print)
    th = {"warmup_s": 300, "train_s": 120, "hang_s": a.hang_s, "live_grace_s": 5,
          "kill_grace_s": 10, "stop_timeout_s": 30}
    cmd = ["python", script, "--threads", str(a.threads), "--steps", str(a.steps),
           "--device", device, "--ckpt", str(out / "ckpt")]
    t0 = time.time()
    plan = run_ops.launch(LaunchOptions(command=cmd, run_file=str(rf), run_name="own-flex",
                                    backoff_scale=0.1, thresholds=th, env_check=False))
    print(f"launched {plan.run_id} ({plan.mode}); run dir {plan.run_dir}", flush=True)
    while time.time() - t0 < a.total_s:
        if run_ops.status(plan.run_id)[0].state.final:
            break
        time.sleep(2)
    else:
        print("time budget spent: stopping the run", flush=True)
        run_ops.stop(plan.run_id, timeout=60)
    res = analyse(Path(plan.run_dir))
    res["wall_s"] = round(time.time() - t0, 1)
    (out / "summary.json").write_text(json.dumps(res, indent=2))
    print(f"\nrun {plan.run_id}: {res['status']} ({res['reason']}); final changes "
          f"{res['overrides']}; best {res['best_tokens_per_s']} tok/s; wall {res['wall_s']} s")
    print("| attempt | changes in force | ended | class | steps |")
    print("|---|---|---|---|---|")
    for at in res["attempts"]:
        how = f"signal {at['signal']}" if at["signal"] else f"exit {at['exit_code']}"
        print(f"| {at['n']} | {at['overrides'] or 'as launched'} | {how} | {at['class']} | "
              f"{at['steps']} |")
    print("\n| failed attempt | class | detection (s) | restart (s) | next step applied |")
    print("|---|---|---|---|---|")
    for r in res["recoveries"]:
        print(f"| {r['attempt']} | {r['class']} | {r['detection_s']} | {r['restart_s']} | "
              f"{r['fallback']} |")
    return 0 if res["status"] == "done" else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
