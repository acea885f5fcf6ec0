#!/usr/bin/env python3
"""`dfo logs -f`: how long from a line written into a run's attempt log to that line shown.

A real run directory on the local transport (state.json ``running`` with this process as
its supervisor pid, events.jsonl, attempt-1.log) and the real CLI as a subprocess
(``python -m orchestrator.cli logs -f --raw``, which starts the far-side follower
``orchestrator.supervisor.follow`` through the transport, as over SSH). This process writes
``LAT <seq> <time>`` lines at random gaps (so they fall at every phase of the follower's
poll) and a reader thread notes when each appears on the CLI's stdout. It also reports the
CPU the CLI and its follower used while following (a busy loop would show here).

    python bench/bench_logs_latency.py [--lines 60] [--passes 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dfo_contract.procs import proc_stat  # noqa: E402
from dfo_contract import runstate as rs  # noqa: E402
from orchestrator.supervisor import runfiles  # noqa: E402


def _cpu_s(pid: int) -> float:
    """utime + stime of a process and its children that are alive, in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = [proc_stat(pid)]
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            st = proc_stat(p.name)
            if st is not None and st.ppid == pid:
                stats.append(st)
    return sum(st.utime + st.stime for st in stats if st is not None) / tick


def one_pass(base: Path, n: int, poll: int, gap: tuple[float, float]) -> dict:
    root = base / f"root-{poll}"
    (root / "envs").mkdir(parents=True)
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), root / "envs" / "current")
    hosts = base / f"hosts-{poll}.yaml"
    hosts.write_text(f"default: local\nhosts:\n  local:\n    transport: local\n    root: {root}\n")
    run_id = "bench-20261201-000000-abcdef"
    run_dir = root / "runs" / run_id
    run_dir.mkdir(parents=True)
    st = rs.new_state(run_id, "bench", now=time.time())
    st.update(status="running", pid=os.getpid(), attempt=1)
    runfiles.write_json_atomic(str(run_dir / rs.STATE_FILE), st)
    runfiles.append_event(str(run_dir / rs.EVENTS_FILE),
                          rs.event("attempt_start", attempt=1, resume=None))
    log = run_dir / rs.attempt_log_name(1)
    log.write_bytes(b"")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "--hosts", str(hosts), "logs",
                          "-f", "--raw", "--run", run_id], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, cwd=str(base))
    shown: dict[int, float] = {}
    first = threading.Event()

    def read() -> None:
        for raw in p.stdout:
            t = time.time()
            parts = raw.decode("utf-8", "replace").split()
            if len(parts) == 3 and parts[0] == "LAT":
                shown[int(parts[1])] = t
            first.set()

    th = threading.Thread(target=read, daemon=True)
    th.start()
    written: dict[int, float] = {}
    rng = random.Random(1234)
    with open(log, "ab", buffering=0) as f:
        f.write(b"LAT -1 0\n")               # the follower is up once this one shows
        if not first.wait(60):
            p.kill()
            raise SystemExit("dfo logs -f showed nothing within 60 s: " + p.stderr.read().decode())
        time.sleep(1.0)
        cpu0, t0 = _cpu_s(p.pid), time.monotonic()
        for i in range(n):
            time.sleep(rng.uniform(*gap))
            written[i] = time.time()
            f.write(f"LAT {i} {written[i]:.6f}\n".encode())
        time.sleep(1.0)
        cpu1, t1 = _cpu_s(p.pid), time.monotonic()
        # idle: nothing written for a while (keepalives only)
        time.sleep(3.0)
        cpu2, t2 = _cpu_s(p.pid), time.monotonic()
    runfiles.append_event(str(run_dir / rs.EVENTS_FILE),
                          rs.event("final", status="done", reason="bench finished"))
    st["status"] = "done"
    runfiles.write_json_atomic(str(run_dir / rs.STATE_FILE), st)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
    th.join(5)
    delays = sorted(shown[i] - written[i] for i in written if i in shown)
    missing = [i for i in written if i not in shown]
    q = statistics.quantiles(delays, n=10) if len(delays) >= 2 else [float("nan")] * 9
    return {"pass": poll, "lines": n,
            "shown": len(delays), "missing": len(missing),
            "median_s": round(statistics.median(delays), 4) if delays else None,
            "p90_s": round(q[8], 4), "max_s": round(max(delays), 4) if delays else None,
            "min_s": round(min(delays), 4) if delays else None,
            "cpu_following_pct": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
            "cpu_idle_pct": round(100 * (cpu2 - cpu1) / (t2 - t1), 2),
            "exit_code": p.returncode}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=60)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--gap", type=float, nargs=2, default=(0.05, 0.35))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    polls = list(range(a.passes))
    out = {"host": os.uname().nodename, "cpus": os.cpu_count(),
           "load": os.getloadavg(), "passes": []}
    with tempfile.TemporaryDirectory(prefix="dfo-bench-logs-") as d:
        for poll in polls:
            r = one_pass(Path(d), a.lines, poll, tuple(a.gap))
            out["passes"].append(r)
            print(json.dumps(r), flush=True)
    med = [r["median_s"] for r in out["passes"] if r["median_s"] is not None]
    if med:
        out["median_vs_aim_0_5s"] = round(statistics.median(med) / 0.5, 3)
        print("median / aim (0.5 s):", out["median_vs_aim_0_5s"])
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
