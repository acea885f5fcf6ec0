#!/usr/bin/env python3
"""Benchmark `dfo deploy` against the lab (sshd node + LXC container 200, offline).

    sudo /work/venv/bin/python bench/bench_deploy.py [--runs 5] [--no-cold]

Prints, for the CPU profile:
- full deploy into an empty root (cold: uv's cache, <root>/uv-cache, is empty, so torch
  is unpacked from the wheelhouse), then again with only envs/ removed (warm uv cache);
- no-op redeploy: the `dfo deploy` command end to end (process start included) and the
  deploy call alone (median of --runs); the aim is <= 2 s;
- repair after drift (an older pyyaml installed into the env).
Needs root (the lab) and network to PyPI on this machine to fill the wheelhouse once.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from fill_wheelhouse import fill  # noqa: E402

from orchestrator.engine.deploy import Deployer  # noqa: E402
from orchestrator.config.inventory import load_inventory  # noqa: E402
from orchestrator.engine.wheel import build as build_wheel  # noqa: E402
from orchestrator.transport import open_transport  # noqa: E402
from tests.lab import Lab  # noqa: E402

ROOT = "/root/dfo-bench"
DFO = str(Path(sys.executable).with_name("dfo"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-cold", action="store_true", help="skip the deploy into an empty root")
    args = ap.parse_args()

    lab = Lab()
    info = lab.up(container=True)  # a lease of this process (pruned if it dies)
    try:
        fill("cpu", Path(info.wheelhouse_host_dir))
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                        "--abi", "cp311", "--platform", "manylinux_2_17_x86_64",
                        "--platform", "manylinux2014_x86_64", "--dest", info.wheelhouse_host_dir,
                        "pyyaml==6.0.2"], check=True)
        tmp = Path(tempfile.mkdtemp(prefix="dfo-bench-"))
        hosts = tmp / "hosts.yaml"
        hosts.write_text(info.hosts_yaml(root=ROOT, wheelhouse=True))
        host = load_inventory(str(hosts)).get("lab")
        wheel = build_wheel(tmp / "cache")
        env = dict(os.environ, DFO_PROJECT_WHEEL=str(wheel.path))
        results: dict[str, object] = {}
        with open_transport(host) as t:
            def fresh(cold: bool) -> float:
                # cold: an empty root (uv's cache is <root>/uv-cache); warm: only the envs go
                t.run(["rm", "-rf", ROOT if cold else f"{ROOT}/envs"], timeout=300, check=True)
                t0 = time.perf_counter()
                r = Deployer(t, host, wheel=wheel).deploy()
                dt = time.perf_counter() - t0
                assert r.action == "create", r.action
                results.setdefault("stages", {})["cold" if cold else "warm"] = {
                    s.stage: s.seconds for s in r.stages}
                return dt

            if not args.no_cold:
                results["full_deploy_cold_cache_s"] = round(fresh(True), 2)
            else:
                fresh(True)
            results["full_deploy_warm_cache_s"] = round(fresh(False), 2)

            cli_times, api_times = [], []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                p = subprocess.run([DFO, "--hosts", str(hosts), "deploy", "--json"], env=env,
                                   capture_output=True, text=True)
                cli_times.append(time.perf_counter() - t0)
                assert p.returncode == 0 and json.loads(p.stdout)["action"] == "noop", p.stderr
                t0 = time.perf_counter()
                assert Deployer(t, host, wheel=wheel).deploy().action == "noop"
                api_times.append(time.perf_counter() - t0)
            results["noop_cli_median_s"] = round(statistics.median(cli_times), 3)
            results["noop_cli_max_s"] = round(max(cli_times), 3)
            results["noop_call_median_s"] = round(statistics.median(api_times), 3)

            py = f"{ROOT}/envs/current/bin/python"
            t.run([f"{ROOT}/bin/uv", "pip", "install", "--python", py, "--no-index", "--offline",
                   "--find-links", "/mnt/wheelhouse", "pyyaml==6.0.2"], timeout=300, check=True)
            t0 = time.perf_counter()
            r = Deployer(t, host, wheel=wheel).deploy()
            results["repair_after_drift_s"] = round(time.perf_counter() - t0, 2)
            assert r.action == "repair", r.action
            results["repair_stages"] = {s.stage: s.seconds for s in r.stages}
            t.run(["rm", "-rf", ROOT], timeout=300)
    finally:
        lab.release()
    print(json.dumps(results, indent=1))
    print(f"no-op redeploy: {results['noop_cli_median_s']} s (dfo command, median of {args.runs}; "
          f"aim <= 2 s), {results['noop_call_median_s']} s (deploy call)")
    if "full_deploy_cold_cache_s" in results:
        print(f"full cpu deploy, cold uv cache: {results['full_deploy_cold_cache_s']} s")
    print(f"full cpu deploy, warm uv cache: {results['full_deploy_warm_cache_s']} s")
    print(f"repair after drift: {results['repair_after_drift_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
