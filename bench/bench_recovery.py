"""GPU acceptance for recovery (one H200): the threaded lazy-compile race's setup
under the dfo supervisor (docs/recovery.md).

    python bench/bench_recovery.py --out /tmp/dfo_recovery [--inject fx_race@5] [--total-s 540]
    python bench/bench_recovery.py --cpu-smoke --out /tmp/dfo_recovery_cpu     # logic check
    python bench/bench_recovery.py --pack --out /tmp/dfo_recovery_packed       # packed rows

Setup (docs/recovery.md, "GPU acceptance"): ``threads`` layout, 3 drafter threads on the one GPU,
``compile.gate: false``, flex attention, torch.compile on, a cold compile cache. The run is
started with ``dfo launch`` on the ``local`` transport (a host root under ``--out`` whose
``envs/current`` is this interpreter's venv) and left to the supervisor: it must detect the
real failure (the FX-tracing error or the hang), recover through the fallback ladder and
reach steady training. ``--inject`` adds a trainer fault if the race does not show by itself.

Prints (and writes ``summary.json``): each attempt (config in force, how it ended, class),
and the recovery timings, to paste into docs/benchmarks.md:
- detection: failure seen -> supervisor decided (for a hang this includes the threshold);
- restart: decision -> next attempt started (the real backoff, scale 1: a restart that applies a
  new fallback waits only the 0.5 s settle time);
- to first step: next attempt started -> its first training step (model load + compile);
- to healthy: failure seen -> first step at >= 50% of the run's best tokens/s.
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
sys.path.insert(0, str(REPO / "bench"))

from dfo_contract.markers import iter_markers  # noqa: E402

#: the GPU run: a 2-layer drafter on flex attention, the threads layout (targets, drafters)
GPU_SETTINGS = {"model.drafter_layers": 2, "model.block_size": 16, "model.attention": "flex",
                "model.mask_token_id": 3,       # the tiny target's unused row (trainer.model.target)
                "data.max_seq_len": 1024, "data.num_anchors": 32, "train.micro_batch": 2,
                "train.grad_accum": 1, "train.log_every": 1, "train.heartbeat_s": 5,
                "checkpoint.every": 10, "checkpoint.keep": 3, "compile.enabled": True,
                "compile.gate": False, "parallel.layout": "threads"}
#: --pack: packed rows, one shape for every micro-batch (docs/trainer.md, "Packed rows")
GPU_PACK = {"data.pack": True, "data.pack_tokens": 2048, "data.pack_anchors": 64}
CPU_PACK = {"data.pack": True, "data.pack_tokens": 128, "data.pack_anchors": 16}
# --gpus 2: the same threads layout across two GPUs (targets and drafters on both)
GPU_DEVICES = {1: (["cuda:0"], ["cuda:0", "cuda:0", "cuda:0"]),
               2: (["cuda:0", "cuda:1"], ["cuda:0", "cuda:1", "cuda:1"])}


def make_assets(out: Path, cpu: bool) -> tuple[str, str]:
    import subprocess

    py = sys.executable
    target, data = out / "target", out / "data.jsonl"
    if not target.is_dir():
        extra = [] if cpu else ["--hidden", "1024", "--layers", "8", "--vocab", "32000", "--heads",
                                "8", "--kv-heads", "4", "--head-dim", "128", "--intermediate",
                                "2816", "--no-tokenizer"]
        subprocess.run([py, "-m", "trainer.model.target", "--out", str(target), *extra], check=True,
                       cwd=REPO)
    if not data.exists():
        extra = ["--num", "256", "--seq-len", "64"] if cpu else \
            ["--num", "512", "--seq-len", "1024", "--vocab", "32000", "--seed", "0"]
        subprocess.run([py, "-m", "trainer.data", "synth", "--out", str(data), *extra],
                       check=True, cwd=REPO)
    return str(target), str(data)


def config_text(out: Path, target: str, data: str, steps: int, cpu: bool, gpus: int = 1,
                pack: bool = False) -> str:
    from run_config import run_config_yaml

    common = {"model.target_path": target, "data.path": data, "train.max_steps": steps}
    if pack:
        common.update(CPU_PACK if cpu else GPU_PACK)
    if not cpu:
        targets, drafters = GPU_DEVICES[gpus]
        return run_config_yaml({**GPU_SETTINGS, **common, "parallel.target_devices": targets,
                                "parallel.drafter_devices": drafters})
    return run_config_yaml({**common, "train.log_every": 1, "train.heartbeat_s": 1.0,
                            "checkpoint.every": 4,
                            "compile.enabled": True, "compile.gate": False},  # the cache path, as on the GPU
                           base="tiny-cpu")


def markers(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return list(iter_markers(log.read_text(errors="replace").splitlines()))


WARM_LINE = re.compile(r"warmup: (\S+) .*?: ([0-9.]+) s\s+fxgraph hit (\d+) miss (\d+)\s+"
                       r"autograd hit (\d+) miss (\d+)(?: bypass (\d+))?")


def warmup_counters(log: Path) -> dict | None:
    """The gate's warm-up lines of one attempt, summed (None: no gated warm-up ran)."""
    if not log.exists():
        return None
    rows = WARM_LINE.findall(log.read_text(errors="replace"))
    if not rows:
        return None
    tot = {"units": len(rows), "seconds": round(sum(float(r[1]) for r in rows), 2)}
    for i, k in enumerate(("fxgraph_hit", "fxgraph_miss", "autograd_hit", "autograd_miss",
                           "autograd_bypass")):
        tot[k] = sum(int(r[2 + i] or 0) for r in rows)
    per_dev: dict[str, float] = {}
    for r in rows:
        per_dev[r[0]] = round(per_dev.get(r[0], 0.0) + float(r[1]), 2)
    tot["seconds_per_device"] = per_dev
    return tot


def analyse(run_dir: Path) -> dict:
    evs = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines() if ln]
    state = json.loads((run_dir / "state.json").read_text())
    attempts = []
    for a in state["attempts"]:
        ms = markers(run_dir / a["log"])
        steps = [m for m in ms if m.get("kind") == "step"]
        attempts.append({"n": a["n"], "overrides": a["overrides"], "class": a.get("cls"),
                         "reason": a.get("reason"), "exit_code": a.get("exit_code"),
                         "signal": a.get("signal"), "steps": len(steps),
                         "first_step_t": steps[0]["t"] if steps else None,
                         "started_at": a["started_at"], "ended_at": a.get("ended_at"),
                         "tokens_per_s": [s.get("tokens_per_s") for s in steps],
                         "warmup": warmup_counters(run_dir / a["log"]),
                         "startup": next((m for m in ms if m.get("kind") == "startup"), None)})
    best = max((x for a in attempts for x in a["tokens_per_s"] if x), default=None)
    timings = []
    for i, a in enumerate(attempts[:-1]):
        nxt = attempts[i + 1]
        wd = [e for e in evs if e.get("attempt") == a["n"] and e["kind"] == "watchdog"]
        cl = next(e for e in evs if e.get("attempt") == a["n"] and e["kind"] == "classified")
        seen = wd[0]["t"] if wd else a["ended_at"]
        if wd and "without progress" in wd[0]["reason"]:
            seen = markers(run_dir / f"attempt-{a['n']}.log")[-1]["t"] if \
                markers(run_dir / f"attempt-{a['n']}.log") else a["started_at"]
        healthy = None
        for m in markers(run_dir / f"attempt-{nxt['n']}.log"):
            if m.get("kind") == "step" and best and (m.get("tokens_per_s") or 0) >= 0.5 * best:
                healthy = m["t"]
                break
        timings.append({
            "attempt": a["n"], "class": cl["class"],
            "detection_s": round(cl["t"] - seen, 1),
            "restart_s": round(nxt["started_at"] - cl["t"], 1),
            "to_first_step_s": round(nxt["first_step_t"] - nxt["started_at"], 1)
            if nxt["first_step_t"] else None,
            "failure_to_healthy_s": round(healthy - seen, 1) if healthy else None,
            "failure_to_first_step_s": round(nxt["first_step_t"] - seen, 1)
            if nxt["first_step_t"] else None,
        })
    return {"status": state["status"], "reason": state["reason"], "overrides": state["overrides"],
            "cache_restores": [e for e in evs if e.get("kind") == "cache_restore"],
            "standby": [e for e in evs if str(e.get("kind", "")).startswith("standby")],
            "best_tokens_per_s": best, "attempts": attempts, "recoveries": timings}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/dfo_recovery")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--inject", default=None, help="a DFO_FAULT spec, e.g. fx_race@5")
    ap.add_argument("--total-s", type=float, default=540.0, help="give up after (< 10 min)")
    ap.add_argument("--warmup-s", type=float, default=150.0, help="hang threshold before step 1")
    ap.add_argument("--train-s", type=float, default=60.0, help="hang threshold while training")
    ap.add_argument("--stop-timeout", type=float, default=90.0,
                    help="when the time is spent: seconds the run gets to stop")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny CPU run (checks this script)")
    ap.add_argument("--gpus", type=int, choices=(1, 2), default=1,
                    help="2: target on cuda:0+1, drafters on cuda:0, cuda:1, cuda:1")
    ap.add_argument("--pack", action="store_true",
                    help="packed rows (one shape to warm up) instead of length buckets")
    a = ap.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = out / "root"
    (root / "envs").mkdir(parents=True, exist_ok=True)
    cur = root / "envs" / "current"
    if not cur.exists():
        os.symlink(sys.prefix, cur)
    target, data = make_assets(out, a.cpu_smoke)
    cfg = out / "recovery.yaml"
    cfg.write_text(config_text(out, target, data, a.steps, a.cpu_smoke, a.gpus, a.pack))

    from orchestrator.config.inventory import HostConfig
    from orchestrator.engine.runs import LaunchOptions, RunOps
    from orchestrator.transport.local import LocalTransport

    host = HostConfig(name="local", transport="local", root=str(root), source="bench")
    run_ops = RunOps(LocalTransport("local"), host, say=print)
    th = {"warmup_s": a.warmup_s, "train_s": a.train_s, "live_grace_s": 5, "kill_grace_s": 10,
          "stop_timeout_s": 60}
    t0 = time.time()
    plan = run_ops.launch(LaunchOptions(config=str(cfg), run_name="recovery", new_lineage=True, fault=a.inject,
                                    backoff_scale=1.0, thresholds=th, env_check=False))
    print(f"launched {plan.run_id} ({plan.mode}); run dir {plan.run_dir}", flush=True)
    while time.time() - t0 < a.total_s:
        if run_ops.status(plan.run_id)[0].state.final:
            break
        time.sleep(2)
    else:
        print("time budget spent: stopping the run", flush=True)
        run_ops.stop(plan.run_id, timeout=a.stop_timeout)
    res = analyse(Path(plan.run_dir))
    res["wall_s"] = round(time.time() - t0, 1)
    (out / "summary.json").write_text(json.dumps(res, indent=2))
    print()
    print(f"run {plan.run_id}: {res['status']} ({res['reason']}); final overrides "
          f"{res['overrides']}; best {res['best_tokens_per_s']} tok/s; wall {res['wall_s']} s")
    print("| attempt | config in force | ended | class | steps |")
    print("|---|---|---|---|---|")
    for at in res["attempts"]:
        how = f"signal {at['signal']}" if at["signal"] else f"exit {at['exit_code']}"
        print(f"| {at['n']} | {at['overrides'] or 'as launched'} | {how} | {at['class']} | "
              f"{at['steps']} |")
    print()
    print("| failed attempt | class | detection (s) | restart (s) | to first step (s) | "
          "failure -> first step (s) | failure -> healthy (s) |")
    print("|---|---|---|---|---|---|---|")
    for r in res["recoveries"]:
        print(f"| {r['attempt']} | {r['class']} | {r['detection_s']} | {r['restart_s']} | "
              f"{r['to_first_step_s']} | {r['failure_to_first_step_s']} | "
              f"{r['failure_to_healthy_s']} |")
    print()
    for at in res["attempts"]:
        w = at["warmup"]
        if w:
            print(f"attempt {at['n']} warm-up: {w['units']} device x shape units, {w['seconds']} s "
                  f"{w['seconds_per_device']}; fxgraph hit {w['fxgraph_hit']} miss "
                  f"{w['fxgraph_miss']}; autograd hit {w['autograd_hit']} miss "
                  f"{w['autograd_miss']} bypass {w['autograd_bypass']}")
        else:
            print(f"attempt {at['n']} warm-up: none reported (gate off: compiles lazily)")
        st = at.get("startup")
        if st:
            parts = ", ".join(f"{k} {v:.1f} s" for k, v in st["phases"].items())
            print(f"attempt {at['n']} startup: {st['total_s']:.1f} s to the training loop ({parts})")
    for e in res["standby"]:
        print("standby: " + ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("t",)))
    return 0 if res["status"] == "done" else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
