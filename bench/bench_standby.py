"""The standby interpreter on one H200: the recovery bench's setup (bench_recovery.py) run
twice side by side, with the standby (default) and with ``--no-standby``.

    python3 bench/bench_standby.py --out $OUT/standby [--inject fx_race@15] [--total-s 270]
    python3 bench/bench_standby.py --cpu-smoke --out /tmp/dfo_standby_cpu      # logic check

Each run: ``threads`` layout, 3 drafter threads on cuda:0, ``compile.gate: false``, flex,
torch.compile on, a fault injected at step N of attempt 1 (the standby starts with attempt 1
on a host with >= 8 CPUs, so step 5 as in bench_recovery.py; on a smaller host it starts at
the first step and the fault must come late enough for its imports). The real backoff
(scale 1: a new fallback waits the 0.5 s settle time). Writes ``standby.json`` and
``nostandby.json`` (bench_recovery.analyse plus the standby events and, per attempt, the
seconds from process start to its first ``@dfo`` marker) and ``summary.json``; prints one
markdown row per run for docs/benchmarks.md. No network, no downloads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import bench_recovery as br  # noqa: E402


def one(out: Path, name: str, standby: bool, a) -> dict:
    from orchestrator.config.inventory import HostConfig
    from orchestrator.engine.runs import LaunchOptions, RunOps
    from orchestrator.transport.local import LocalTransport

    d = out / name
    root = d / "root"
    (root / "envs").mkdir(parents=True, exist_ok=True)
    cur = root / "envs" / "current"
    if not cur.exists():
        os.symlink(sys.prefix, cur)
    target, data = br.make_assets(out, a.cpu_smoke)
    cfg = d / "recovery.yaml"
    cfg.write_text(br.config_text(d, target, data, a.steps, a.cpu_smoke))
    host = HostConfig(name="local", transport="local", root=str(root), source="bench")
    run_ops = RunOps(LocalTransport("local"), host, say=print)
    th = {"warmup_s": a.warmup_s, "train_s": a.train_s, "live_grace_s": 5, "kill_grace_s": 10,
          "stop_timeout_s": 60, "standby_wait_s": a.standby_wait_s}
    t0 = time.time()
    plan = run_ops.launch(LaunchOptions(config=str(cfg), run_name="standby", new_lineage=True,
                                    fault=a.inject, backoff_scale=1.0, thresholds=th,
                                    env_check=False, standby=standby))
    print(f"{name}: launched {plan.run_id}", flush=True)
    while time.time() - t0 < a.total_s:
        if run_ops.status(plan.run_id)[0].state.final:
            break
        time.sleep(2)
    else:
        run_ops.stop(plan.run_id, timeout=60)
    run_dir = Path(plan.run_dir)
    res = br.analyse(run_dir)
    evs = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines() if ln]
    res["standby_events"] = [e for e in evs if str(e.get("kind")).startswith("standby_")]
    for at in res["attempts"]:
        ms = br.markers(run_dir / f"attempt-{at['n']}.log")
        at["to_first_marker_s"] = round(ms[0]["t"] - at["started_at"], 2) if ms else None
    res["wall_s"] = round(time.time() - t0, 1)
    (out / f"{name}.json").write_text(json.dumps(res, indent=2))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp") + "/standby")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--inject", default="fx_race@5")
    ap.add_argument("--total-s", type=float, default=270.0, help="per run (two runs)")
    ap.add_argument("--warmup-s", type=float, default=150.0)
    ap.add_argument("--train-s", type=float, default=60.0)
    ap.add_argument("--standby-wait-s", type=float, default=0.0)
    ap.add_argument("--order", default="standby,nostandby",
                    help="which run goes first (the first also pays a cold page cache)")
    ap.add_argument("--cpu-smoke", action="store_true")
    a = ap.parse_args(argv)
    order = [x.strip() for x in a.order.split(",")]
    if sorted(order) != ["nostandby", "standby"]:
        ap.error("--order: give standby,nostandby or nostandby,standby")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    for name in order:
        rows[name] = one(out, name, name == "standby", a)
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    print("| run | status | standby | attempt 2 start -> first marker (s) | "
          "to first step (s) | failure -> first step (s) | failure -> healthy (s) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        rec = r["recoveries"][0] if r["recoveries"] else {}
        att2 = r["attempts"][1] if len(r["attempts"]) > 1 else {}
        used = [e for e in r["standby_events"] if e["kind"] in ("standby_used",
                                                                "standby_discarded")]
        how = (used[0]["kind"] + (f" ({used[0].get('reason')})" if used[0].get("reason") else "")
               if used else "none")
        print(f"| {name} | {r['status']} | {how} | {att2.get('to_first_marker_s')} | "
              f"{rec.get('to_first_step_s')} | {rec.get('failure_to_first_step_s')} | "
              f"{rec.get('failure_to_healthy_s')} |")
    for name, r in rows.items():
        for at in r["attempts"]:
            st = at.get("startup")
            if st:
                parts = ", ".join(f"{k} {v:.1f} s" for k, v in st["phases"].items())
                print(f"{name} attempt {at['n']} startup: {st['total_s']:.1f} s ({parts})")
        for e in r["standby_events"]:
            print(f"{name} " + ", ".join(f"{k}={v}" for k, v in e.items() if k != "t"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
