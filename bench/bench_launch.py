#!/usr/bin/env python3
"""`dfo launch` until the supervisor runs, on the local transport: with the env's recorded
verification (the normal path) vs verifying the env from scratch (the env probe imports
torch; what every launch did before the record), side by side in one run.

Each launch is the real CLI as a subprocess (``python -m orchestrator.cli launch``, the
tiny CPU config, a fresh run name), timed from its start to its exit (it exits once the
supervisor holds run.lock and runs), then the run is stopped. "before" launches first
delete ``<env>/.dfo-verified`` so the launch probes the env, as the first launch after a
deploy does; "after" launches find the record. The two kinds alternate, so load hits both alike.

    python bench/bench_launch.py [--n 5] [--root ROOT] [--baseline-checkout DIR] [--json OUT]

``--baseline-checkout DIR`` adds a third kind, "baseline": the CLI of another checkout (e.g. a
commit from before the recorded verification) launching against the same env, with this
checkout's dfo wheel pinned (``DFO_PROJECT_WHEEL``) so its env check passes.

Without ``--root`` it deploys a fresh env under a temporary root first (``dfo deploy`` on
the local transport, offline: needs uv's cache or PIP_FIND_LINKS to hold the cpu lock's
wheels).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.config.inventory import HostConfig  # noqa: E402
from orchestrator.engine.deploy import Deployer  # noqa: E402
from orchestrator.engine.runs import RunOps  # noqa: E402
from orchestrator.plan.launch_facts import VERIFIED_FILE  # noqa: E402
from orchestrator.transport import LocalTransport  # noqa: E402


def assets(d: Path) -> Path:
    py = sys.executable
    if not (d / "target").is_dir():
        subprocess.run([py, "-m", "trainer.model.target", "--out", str(d / "target")], check=True,
                       capture_output=True, cwd=REPO, timeout=600)
    if not (d / "synth.jsonl").is_file():
        subprocess.run([py, "-m", "trainer.data", "synth", "--out", str(d / "synth.jsonl"),
                        "--num", "256", "--seq-len", "64"], check=True, capture_output=True,
                       cwd=REPO, timeout=600)
    cfg = yaml.safe_load((REPO / "orchestrator/config/defaults/tiny-cpu.yaml").read_text())
    cfg["model"]["target_path"] = str(d / "target")
    cfg["data"]["path"] = str(d / "synth.jsonl")
    cfg["train"]["max_steps"] = 100000
    cfg.pop("run", None)
    path = d / "bench.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def launch_once(hosts: Path, cfg: Path, name: str, code: Path = REPO,
                wheel: str | None = None) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(code))
    # as on a user's machine: Python keeps its bytecode (the CLI's and, on the host, the
    # env's), rather than compiling every module on every start
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if wheel:
        env["DFO_PROJECT_WHEEL"] = wheel
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "--hosts", str(hosts),
                        "launch", "--config", str(cfg), "--run-name", name, "--json"],
                       capture_output=True, text=True, env=env, timeout=600, cwd=str(code))
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"launch {name} failed ({r.returncode}): {r.stderr.strip()}")
    run_id = json.loads(r.stdout)["run_id"]
    return dt, run_id


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5, help="launches of each kind")
    ap.add_argument("--root", default=None, help="a root with a deployed env (default: deploy one)")
    ap.add_argument("--baseline-checkout", default=None, help="also launch with this checkout's CLI")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="dfo-bench-launch-")
    base = Path(tmp.name)
    root = Path(a.root) if a.root else base / "root"
    host = HostConfig(name="local", transport="local", root=str(root), source="bench")
    t = LocalTransport("local")
    out: dict = {"host": os.uname().nodename, "cpus": os.cpu_count(), "load_start": os.getloadavg()}
    if not a.root:
        t0 = time.perf_counter()
        rep = Deployer(t, host, environ=dict(os.environ, UV_OFFLINE="1")).deploy()
        out["deploy"] = {"action": rep.action, "seconds": round(time.perf_counter() - t0, 2)}
        print("deploy:", out["deploy"], flush=True)
    hosts = base / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"default": "local", "hosts": {"local": {
        "transport": "local", "root": str(root)}}}))
    cfg = assets(base / "assets")
    run_ops = RunOps(t, host)
    record = Path(host.tree.current_env) / VERIFIED_FILE
    kinds = ["before", "after"] + (["baseline"] if a.baseline_checkout else [])
    times: dict[str, list[float]] = {k: [] for k in kinds}
    wheel = str(Deployer(t, host).wheel().path)
    stamp = time.strftime("%H%M%S")
    # one launch to make the record (and warm the page cache for both kinds)
    dt, rid = launch_once(hosts, cfg, f"warm{stamp}")
    run_ops.stop(rid, timeout=120)
    out["first_launch_s"] = round(dt, 3)
    for i in range(a.n):
        for kind in kinds:
            if kind == "before":
                record.unlink(missing_ok=True)
            elif kind == "after" and not record.is_file():
                raise SystemExit("the launch before did not record the verification")
            if kind == "baseline":
                dt, rid = launch_once(hosts, cfg, f"o{stamp}{i}", Path(a.baseline_checkout), wheel)
            else:
                dt, rid = launch_once(hosts, cfg, f"{kind[0]}{stamp}{i}")
            times[kind].append(round(dt, 3))
            print(f"{kind:6s} {i}: {dt:.3f} s  ({rid})", flush=True)
            run_ops.stop(rid, timeout=120)
    out["seconds"] = times
    out["median_before_s"] = statistics.median(times["before"])
    out["median_after_s"] = statistics.median(times["after"])
    out["ratio_after_to_before"] = round(out["median_after_s"] / out["median_before_s"], 3)
    if "baseline" in times:
        out["median_baseline_s"] = statistics.median(times["baseline"])
        out["ratio_after_to_baseline"] = round(out["median_after_s"] / out["median_baseline_s"], 3)
        print(f"median baseline checkout {out['median_baseline_s']:.3f} s, ratio after/baseline "
              f"{out['ratio_after_to_baseline']}", flush=True)
    out["load_end"] = os.getloadavg()
    print(f"median before {out['median_before_s']:.3f} s, after {out['median_after_s']:.3f} s, "
          f"ratio {out['ratio_after_to_before']}", flush=True)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
