#!/usr/bin/env python3
"""`dfo launch` on the lab's proxmox transport (sshd "node" + `pct exec` into LXC container
200, tests/lab): how many remote round trips it makes before the supervisor starts, and how
long it takes, for this checkout and (``--baseline-checkout DIR``) another side by side.

    python bench/bench_launch_rtt.py [--n 3] [--baseline-checkout DIR] [--compile] [--json OUT]

Each checkout gets its own root in the container with an env that ``dfo deploy`` of that
checkout built (offline, from the lab's wheelhouse), and the tiny CPU config's assets
(``--compile``: with ``compile.enabled: true``, so launch asks for the compile-cache key's
inputs too). Each launch is ``bench/launch_rtt_driver.py`` run with that checkout on
PYTHONPATH: the real ``RunOps.launch`` (env check on, as a user runs it) through a transport
that counts its calls (``run``/``stream``/``put``/``get``) and the SSH channels under them;
the run is stopped after. An earlier commit as the baseline checkout: ``git worktree add
/tmp/dfo-baseline <commit>``, or ``git archive <commit> | tar -x -C /tmp/dfo-baseline``.
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

from tests.helpers.wheelhouse import fill_wheelhouse  # noqa: E402
from tests.lab import Lab  # noqa: E402

LEASE = "bench-launch-rtt"
DRIVER = REPO / "bench" / "launch_rtt_driver.py"


def sh(argv, code: Path, env=None, timeout=1800) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=str(code))
    e.pop("PYTHONDONTWRITEBYTECODE", None)
    e.pop("DFO_PROJECT_WHEEL", None)
    e.update(env or {})
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=str(code),
                          env=e)


def cli(code: Path, hosts: Path, *args, env=None, timeout=1800) -> subprocess.CompletedProcess:
    r = sh([sys.executable, "-m", "orchestrator.cli", "--hosts", str(hosts), *args], code,
           env=env, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"dfo {' '.join(args)} ({code}) failed ({r.returncode}): "
                         f"{r.stderr.strip()[-2000:]}")
    return r


def prepare(lab, code: Path, root: str, work: Path, env: dict,
            compile_: bool = False) -> tuple[Path, Path]:
    """Deploy ``code``'s env into ``root`` (its own wheel, built once and pinned in ``env``:
    the env check compares with it) and make the tiny assets there."""
    r = sh([sys.executable, "-c", "from orchestrator.engine.wheel import build; "
            "print(build().path)"], code, env=env)
    if r.returncode != 0:
        raise SystemExit(f"building the wheel of {code} failed: {r.stderr.strip()[-2000:]}")
    env["DFO_PROJECT_WHEEL"] = r.stdout.strip().splitlines()[-1]
    hosts = work / f"hosts-{Path(root).name}.yaml"
    hosts.write_text(lab.hosts_yaml(root=root, wheelhouse=True))
    t0 = time.perf_counter()
    cli(code, hosts, "deploy", "--host", "lab", env=env)
    print(f"deploy {code} -> {root}: {time.perf_counter() - t0:.1f} s", flush=True)
    py = f"{root}/envs/current/bin/python"
    from orchestrator.config.inventory import load_inventory
    from orchestrator.transport import open_transport

    t = open_transport(load_inventory(str(hosts)).get("lab"))
    a = f"{root}/assets"
    target = "trainer.model.target" if (code / "trainer/model/target.py").exists() else "trainer.target"
    t.run([py, "-m", target, "--out", f"{a}/target"], timeout=600, check=True)
    t.run([py, "-m", "trainer.data", "synth", "--out", f"{a}/synth.jsonl", "--num", "256",
           "--seq-len", "64"], timeout=600, check=True)
    t.close()
    cfg = yaml.safe_load((REPO / "orchestrator/config/defaults/tiny-cpu.yaml").read_text())
    cfg["model"]["target_path"], cfg["data"]["path"] = f"{a}/target", f"{a}/synth.jsonl"
    cfg["train"]["max_steps"] = 100000
    cfg["compile"]["enabled"] = compile_
    cfg.pop("run", None)
    path = work / f"bench-{Path(root).name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return hosts, path


def launch(code: Path, hosts: Path, cfg: Path, name: str, env: dict, dry: bool = False) -> dict:
    r = sh([sys.executable, str(DRIVER), "--hosts", str(hosts), "--config", str(cfg),
            "--run-name", name, "--stop", *(["--dry-run"] if dry else [])], code, env=env)
    if r.returncode != 0:
        raise SystemExit(f"launch {name} ({code}) failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3, help="launches of each checkout")
    ap.add_argument("--baseline-checkout", default=None, help="also measure this checkout")
    ap.add_argument("--root", default="/root/dfo-bench-rtt")
    ap.add_argument("--compile", action="store_true", help="compile.enabled: true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    lab = Lab()
    work = Path(tempfile.mkdtemp(prefix="dfo-bench-rtt-"))
    out: dict = {"host": os.uname().nodename, "cpus": os.cpu_count(), "transport": "proxmox",
                 "compile": a.compile,
                 "load_start": os.getloadavg(), "kinds": {}}
    try:
        info = lab.up(container=True, lease=LEASE)
        fill_wheelhouse(Path(info.wheelhouse_host_dir))
        kinds = [("this", REPO, a.root)]
        if a.baseline_checkout:
            kinds.append(("baseline", Path(a.baseline_checkout).resolve(), a.root + "-baseline"))
        setups = {}
        for kind, code, root in kinds:
            env = {"DFO_CACHE_DIR": str(work / f"cache-{kind}")}
            setups[kind] = (code, *prepare(info, code, root, work, env, a.compile), env)
        stamp = time.strftime("%H%M%S")
        runs: dict[str, list[dict]] = {k: [] for k, _, _ in kinds}
        for kind, (code, hosts, cfg, env) in setups.items():   # a first launch of each:
            launch(code, hosts, cfg, f"warm{kind}{stamp}", env)  # the env's verification
        for i in range(a.n):
            for kind, (code, hosts, cfg, env) in setups.items():
                d = launch(code, hosts, cfg, f"{kind}{stamp}{i}", env)
                runs[kind].append(d)
                print(f"{kind} {i}: {d['calls_before_start']} round trips "
                      f"({d['channels_before_start']} ssh channels) before the supervisor "
                      f"started, {d['s_to_start']:.3f} s; launch returned after "
                      f"{d['s_total']:.3f} s", flush=True)
        for kind, (code, hosts, cfg, env) in setups.items():
            d = launch(code, hosts, cfg, f"dry{kind}{stamp}", env, dry=True)
            runs[kind].append({**d, "dry_run": True})
            print(f"{kind} --dry-run: {d['calls_total']} round trips, {d['s_total']:.3f} s")
        for kind, rs in runs.items():
            real = [r for r in rs if not r.get("dry_run")]
            out["kinds"][kind] = {
                "round_trips_before_start": [r["calls_before_start"] for r in real],
                "ssh_channels_before_start": [r["channels_before_start"] for r in real],
                "median_s_to_start": statistics.median(r["s_to_start"] for r in real),
                "median_s_launch": statistics.median(r["s_total"] for r in real),
                "dry_run_round_trips": [r["calls_total"] for r in rs if r.get("dry_run")],
                "calls_of_one_launch": real[0]["calls"][: real[0]["calls_before_start"]],
            }
        out["load_end"] = os.getloadavg()
        print(json.dumps({k: {x: y for x, y in v.items() if x != "calls_of_one_launch"}
                          for k, v in out["kinds"].items()}, indent=1))
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    finally:
        lab.release(LEASE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
