"""Cold vs restored-snapshot start of the trainer's warm-up (``python -m trainer warmup``).

    python bench/bench_cache.py                    # CPU (tiny model, sdpa, compiled drafter step)
    python bench/bench_cache.py --device cuda      # GPU (flex attention), e.g. on the H200
    python bench/bench_cache.py --config my.yaml   # your own trainer config (paths on this machine)
    python bench/bench_cache.py --device cuda --set data.seq_buckets=1024   # overrides

Uses the real pieces on this machine (the ``local`` transport): an env root whose
``envs/current`` runs this interpreter with a fingerprint from dfo's deploy probe,
``CacheManager.warm`` (cold warm-up in a fresh process + snapshot), a wipe of the live
cache, ``restore_from_store`` (verified), then the trainer's warm-up again in a fresh
process on a run copy of the restored cache. Prints the figures and the warm/cold ratio
(aim: warm <= 20% of cold), with the fxgraph and AOT-autograd cache hit/miss/bypass
counts per shape and AOT-autograd's bypass reasons, plus one JSON line (``BENCH {...}``) for docs/benchmarks.md.
Every step has a timeout; the whole run is bounded by ``--budget`` seconds (default 280).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.config.runconfig import load_config  # noqa: E402
from orchestrator.engine.cache import CacheManager  # noqa: E402
from orchestrator.ops.warmup import parse_report, warmup_argv  # noqa: E402
from orchestrator.ops import snapshot as sn  # noqa: E402
from orchestrator.ops.fingerprint import PROBE_SCRIPT, build_fingerprint, parse_probe  # noqa: E402
from orchestrator.ops.layout import RemoteLayout  # noqa: E402
from orchestrator.transport.local import LocalTransport  # noqa: E402


def make_env_root(root: Path, profile: str) -> None:
    env = root / "envs" / f"{profile}-bench"
    (env / "bin").mkdir(parents=True, exist_ok=True)
    py = env / "bin" / "python"
    # the repo on PYTHONPATH: the trainer runs from this checkout even when dfo is not installed
    py.write_text(f"#!/bin/sh\nPYTHONPATH={REPO}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    out = subprocess.run([str(py), "-c", PROBE_SCRIPT], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    fp = build_fingerprint(parse_probe(out), profile=profile, lock_hash="0" * 64)
    (env / "fingerprint.json").write_text(json.dumps(fp))
    (root / "envs" / "current").symlink_to(env.name)


def make_config(work: Path, device: str) -> Path:
    target = work / "target"
    if device == "cuda":
        targs = ["--hidden", "512", "--layers", "6", "--heads", "8", "--kv-heads", "4",
                 "--head-dim", "64", "--intermediate", "1024", "--vocab", "4096"]
        body = ("model: {target_path: %s, drafter_layers: 2, block_size: 16, attention: flex}\n"
                "data: {path: %s/unused.jsonl, max_seq_len: 1024, num_anchors: 32,\n"
                "       seq_buckets: [512, 1024], anchor_buckets: [32]}\n"
                "parallel: {layout: single, target_devices: ['cuda:0'], drafter_devices: ['cuda:0']}\n"
                "compile: {enabled: true}\n")
    else:
        targs = []
        body = ("model: {target_path: %s, drafter_layers: 1, block_size: 4}\n"
                "data: {path: %s/unused.jsonl, max_seq_len: 64, num_anchors: 8,\n"
                "       seq_buckets: [32, 64], anchor_buckets: [8]}\n"
                "parallel: {target_devices: [cpu], drafter_devices: [cpu]}\n"
                "compile: {enabled: true}\n")
    subprocess.run([sys.executable, "-m", "trainer.target", "--out", str(target), *targs],
                   check=True, capture_output=True, timeout=300, cwd=str(REPO))
    cfg = work / f"bench-{device}.yaml"
    cfg.write_text(body % (target, work))
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--config", help="trainer config (default: a generated tiny one for --device)")
    ap.add_argument("--workdir", help="keep everything here (default: a temp dir, removed)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="trainer config override (repeatable), e.g. --set model.attention=sdpa")
    ap.add_argument("--budget", type=float, default=280.0, help="seconds for the whole run")
    a = ap.parse_args()

    t_start = time.monotonic()
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="dfo-bench-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        root = work / "root"
        if root.exists():
            shutil.rmtree(root)
        make_env_root(root, "gpu" if a.device == "cuda" else "cpu")
        cfg_path = Path(a.config) if a.config else make_config(work, a.device)
        overrides = [tuple(x.split("=", 1)) for x in a.sets]
        cfg, text = load_config(cfg_path, overrides)

        def left() -> float:
            rest = a.budget - (time.monotonic() - t_start)
            if rest < 10:
                raise SystemExit(f"bench: out of budget ({a.budget:.0f}s)")
            return rest

        mgr = CacheManager(LocalTransport(), RemoteLayout(str(root)), host="bench", timeout=left())
        key = mgr.key(cfg)
        print(f"bench: device {a.device}, key {key.key}, torch {key.components['torch.__version__']}, "
              f"gpu {key.components['gpu']}", flush=True)

        # 1. cold: the trainer's warm-up in a fresh process on an empty cache, then the snapshot
        t0 = time.monotonic()
        res = mgr.warm(key, text, overrides, measure=False, fresh=True)
        cold_wall = time.monotonic() - t0
        # 2. wipe the live cache and restore the verified snapshot
        p = sn.paths(mgr.layout, key.key)
        shutil.rmtree(os.path.realpath(p.live))
        os.unlink(p.live)
        mgr.timeout = left()
        t0 = time.monotonic()
        mgr.restore_from_store(key)
        restore_s = time.monotonic() - t0
        # 3. warm: a fresh process on a run copy of the restored cache
        run = root / "runs" / "warm"
        t0 = time.monotonic()
        for argv in sn.seed_run_cache_argvs(mgr.layout, key.key, str(run)):
            subprocess.run(argv, check=True, timeout=left())
        seed_s = time.monotonic() - t0
        report = run / "report.json"
        t0 = time.monotonic()
        r = subprocess.run(warmup_argv(str(root / "envs/current/bin/python"), str(cfg_path), overrides, str(report)),
                           env=dict(os.environ, **sn.cache_env(mgr.layout, key.key, str(run))),
                           capture_output=True, text=True, timeout=left())
        warm_wall = time.monotonic() - t0
        if r.returncode != 0:
            print((r.stdout + r.stderr)[-3000:], file=sys.stderr)
            return 1
        wrecs, wtot, warm_s = parse_report(report.read_bytes())

        def ag(c: dict) -> str:
            return "/".join(str(c.get(f"autograd_cache_{k}", 0)) for k in ("hit", "miss", "bypass"))

        print(f"{'device':8} {'shape':>10} {'cold s':>8} {'warm s':>8}  fxgraph hit/miss cold -> warm"
              f"   autograd hit/miss/bypass cold -> warm")
        for c, w in zip(res.records, wrecs):
            cc, wc = c["counters"], w["counters"]
            print(f"{c['device']:8} {'x'.join(map(str, c['shape'])):>10} {c['seconds']:8.2f} {w['seconds']:8.2f}  "
                  f"{cc.get('fxgraph_cache_hit', 0)}/{cc.get('fxgraph_cache_miss', 0)} -> "
                  f"{wc.get('fxgraph_cache_hit', 0)}/{wc.get('fxgraph_cache_miss', 0)}"
                  f"{'':16}{ag(cc)} -> {ag(wc)}")
        bypass = json.loads(report.read_text()).get("autograd_bypass_reasons") or []
        for why in bypass:
            print(f"autograd cache bypassed (warm): {why}")
        ratio = warm_s / res.cold_s if res.cold_s else float("nan")
        print(f"warm-up (trainer-reported): cold {res.cold_s:.2f}s, warm {warm_s:.2f}s, "
              f"ratio {ratio:.1%} (aim <= 20%: {'met' if ratio <= 0.20 else 'NOT met'})")
        print(f"process wall (incl. python+torch import): cold {cold_wall:.2f}s (incl. snapshot), "
              f"warm {warm_wall:.2f}s")
        print(f"snapshot: {res.snapshot_size / 1e6:.1f} MB tar, restore+verify {restore_s:.2f}s, "
              f"run copy {seed_s:.2f}s")
        out = {"device": a.device, "key": key.key, "torch": key.components["torch.__version__"],
               "gpu": key.components["gpu"], "shapes": len(res.records),
               "cold_s": res.cold_s, "warm_s": warm_s, "ratio": round(ratio, 4),
               "cold_counters": res.counters, "warm_counters": wtot,
               "autograd_bypass_reasons": bypass,
               "cold_wall_s": round(cold_wall, 2), "warm_wall_s": round(warm_wall, 2),
               "restore_s": round(restore_s, 2), "seed_s": round(seed_s, 2),
               "snapshot_bytes": res.snapshot_size, "total_s": round(time.monotonic() - t_start, 1)}
        print("BENCH " + json.dumps(out), flush=True)
        return 0
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
