#!/usr/bin/env python3
"""One ``dfo launch`` (``RunOps.launch``, what the CLI calls) through a transport that counts
its round trips; prints one JSON line. Run by ``bench/bench_launch_rtt.py`` with PYTHONPATH
set to the checkout under test (this file uses only what every checkout has: the inventory
loader, ``open_transport``, ``RunOps``, ``LaunchOptions``).

    python bench/launch_rtt_driver.py --hosts H --host lab --config C --run-name N [--stop]

The counting is ``tests/helpers/rtt.py`` (``CountingTransport``) of this checkout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path


def counting_transport():
    """tests/helpers/rtt.py of THIS checkout, whatever checkout is on PYTHONPATH."""
    path = Path(__file__).resolve().parents[1] / "tests" / "helpers" / "rtt.py"
    spec = importlib.util.spec_from_file_location("dfo_bench_rtt", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CountingTransport


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", required=True)
    ap.add_argument("--host", default="lab")
    ap.add_argument("--config", required=True)
    ap.add_argument("--run-name", required=True)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--stop", action="store_true", help="stop the run afterwards")
    a = ap.parse_args()
    from orchestrator.config.inventory import load_inventory
    from orchestrator.engine.runs import LaunchOptions, RunOps
    from orchestrator.transport import open_transport

    host = load_inventory(a.hosts).get(a.host)
    t = counting_transport()(open_transport(host))
    run_ops = RunOps(t, host)
    t0 = time.perf_counter()
    plan = run_ops.launch(LaunchOptions(config=a.config, run_name=a.run_name, dry_run=a.dry_run,
                                    backoff_scale=0.01, start_timeout=180))
    t_end = time.perf_counter()
    n_launch = len(t.calls)
    out = {"run_id": plan.run_id, "calls_before_start": t.start_call,
           "channels_before_start": t.channels_at_start,
           "calls_total": n_launch, "channels_total": t.channels,
           "s_to_start": None if t.t_start is None else round(t.t_start - t0, 3),
           "s_total": round(t_end - t0, 3), "calls": t.calls}
    if a.stop and not a.dry_run:
        run_ops.stop(plan.run_id, timeout=180)
    t.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
