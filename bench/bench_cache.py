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

``--variants`` measures several starts side by side, each in a fresh process (default
``cold,restored``: the definition above):

- ``cold``: the warm-up on an empty cache (``compile.precompile`` off), then the snapshot;
- ``restored``: the snapshot of ``cold`` restored, the warm-up on a run copy;
- ``cold+precompile``: the same with ``compile.precompile: true`` (its own cache key). With
  ``--precompile-cold seeded`` its cache starts as a copy of ``cold``'s (inductor and triton
  entries hit, AOT autograd and dynamo run): cheaper, so its time is NOT a cold start and is
  never used as one (the ratios divide by ``cold``);
- ``restored+precompile``: the snapshot of ``cold+precompile`` restored, the warm-up on a
  run copy: dynamo loads its traced code from the precompile cache instead of re-tracing.

Per variant and shape it prints the time, the cache counters and the compile phases
(``torch._dynamo.utils.compilation_time_metrics``: dynamo in all, its own tracing, AOT,
inductor compile/load, precompile load), plus ``build_models``; then every restored
variant's ratio to ``cold`` (and to its own cold where that one was a real cold start).
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
sys.path.insert(0, str(REPO / "bench"))

from orchestrator.config.runconfig import load_layers  # noqa: E402
from orchestrator.engine.compile_cache import CacheManager  # noqa: E402
from orchestrator.plan.trainer_warmup import parse_report, warmup_argv  # noqa: E402
from orchestrator.plan import snapshot as sn  # noqa: E402
from orchestrator.plan.fingerprint import PROBE_SCRIPT, build_fingerprint, parse_probe  # noqa: E402
from orchestrator.config.host_tree import HostTree  # noqa: E402
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
        sets = {"model.drafter_layers": 2, "model.block_size": 16, "model.attention": "flex",
                "data.max_seq_len": 1024, "data.num_anchors": 32, "data.seq_buckets": [512, 1024],
                "data.anchor_buckets": [32], "parallel.layout": "single",
                "parallel.target_devices": ["cuda:0"], "parallel.drafter_devices": ["cuda:0"]}
    else:
        targs = []
        sets = {"model.drafter_layers": 1, "model.block_size": 4, "data.max_seq_len": 64,
                "data.num_anchors": 8, "data.seq_buckets": [32, 64], "data.anchor_buckets": [8],
                "parallel.target_devices": ["cpu"], "parallel.drafter_devices": ["cpu"]}
    subprocess.run([sys.executable, "-m", "trainer.model.target", "--out", str(target), *targs],
                   check=True, capture_output=True, timeout=300, cwd=str(REPO))
    cfg = work / f"bench-{device}.yaml"
    from run_config import run_config_yaml

    cfg.write_text(run_config_yaml({**sets, "model.target_path": str(target),
                                    "data.path": f"{work}/unused.jsonl", "compile.enabled": True}))
    return cfg


VARIANTS = ("cold", "restored", "cold+precompile", "restored+precompile")


def _ag(c: dict) -> str:
    return "/".join(str(c.get(f"autograd_cache_{k}", 0)) for k in ("hit", "miss", "bypass"))


def _phases(p: dict) -> str:
    g = lambda k: p.get(k, 0.0)  # noqa: E731
    return (f"dynamo {g('dynamo'):.2f} (trace {g('dynamo_trace'):.2f}, precompile load "
            f"{g('precompile_load'):.2f}, aot {g('aot'):.2f}, inductor compile "
            f"{g('inductor_compile'):.2f} load {g('inductor_load'):.2f}), bwd compile "
            f"{g('backward_compile'):.2f}, other {g('other'):.2f}")


def print_variant(name: str, v: dict) -> None:
    print(f"-- {name}: warm-up {v['seconds']:.2f} s (trainer-reported), build_models "
          f"{sum(v['build_models_s'].values()):.2f} s, process wall {v['wall_s']:.2f} s")
    for r in v["records"]:
        c = r["counters"]
        print(f"   {r['device']:8} {'x'.join(map(str, r['shape'])):>10} {r['seconds']:8.2f} s  "
              f"fxgraph {c.get('fxgraph_cache_hit', 0)}/{c.get('fxgraph_cache_miss', 0)}  autograd "
              f"{_ag(c)}  dynamo cache {c.get('dynamo_cache_hit', 0)}/{c.get('dynamo_cache_miss', 0)}"
              f"/{c.get('dynamo_cache_error', 0)}")
        if r.get("phases"):
            print(f"   {'':8} {'':>10} phases: {_phases(r['phases'])}")
    for ln in v.get("phase_lines") or []:
        print(f"   {ln}")
    for why in v.get("autograd_bypass_reasons") or []:
        print(f"   autograd cache bypassed: {why}")
    if v.get("precompile_check", {}).get("dropped"):
        print(f"   precompile entries dropped: {v['precompile_check']['dropped']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--config", help="trainer config (default: a generated tiny one for --device)")
    ap.add_argument("--workdir", help="keep everything here (default: a temp dir, removed)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="trainer config override (repeatable), e.g. --set model.attention=sdpa")
    ap.add_argument("--budget", type=float, default=280.0, help="seconds for the whole run")
    ap.add_argument("--variants", default="cold,restored",
                    help=f"comma list of {','.join(VARIANTS)} (or 'all'), run in that order")
    ap.add_argument("--precompile-cold", choices=("full", "seeded"), default="full",
                    help="cold+precompile from an empty cache (full) or from a copy of cold's (seeded)")
    a = ap.parse_args()
    variants = list(VARIANTS) if a.variants == "all" else [v.strip() for v in a.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"--variants: unknown variant {v!r} (one of {', '.join(VARIANTS)})")
    for need, v in (("cold", "restored"), ("cold+precompile", "restored+precompile")):
        if v in variants and need not in variants:
            ap.error(f"--variants: {v} needs {need} before it")
    if a.precompile_cold == "seeded" and "cold+precompile" in variants and "cold" not in variants:
        ap.error("--precompile-cold seeded needs the cold variant")

    t_start = time.monotonic()
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="dfo-bench-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        root = work / "root"
        if root.exists():
            shutil.rmtree(root)
        make_env_root(root, "gpu" if a.device == "cuda" else "cpu")
        cfg_path = Path(a.config) if a.config else make_config(work, a.device)
        base = [tuple(x.split("=", 1)) for x in a.sets]

        def left() -> float:
            rest = a.budget - (time.monotonic() - t_start)
            if rest < 10:
                raise SystemExit(f"bench: out of budget ({a.budget:.0f}s)")
            return rest

        lines: list[str] = []  # the cold warm-ups' output (their phases lines)

        def on_event(kind: str, ev: dict) -> None:
            if kind == "line" and str(ev.get("line", "")).startswith("warmup: "):
                lines.append(ev["line"])

        mgr = CacheManager(LocalTransport(), HostTree(str(root)), host="bench", timeout=left(),
                           events=on_event)
        setups = {}
        for flavour, extra in (("", []), ("+precompile", [("compile.precompile", "true")])):
            overrides = base + extra
            layers = load_layers(cfg_path, overrides)
            setups[flavour] = (mgr.key(layers.config, source=str(cfg_path)), layers.data, overrides)
        key0 = setups[""][0]
        print(f"bench: device {a.device}, key {key0.key}, torch {key0.components['torch.__version__']}, "
              f"gpu {key0.components['gpu']}, variants {','.join(variants)}", flush=True)

        results: dict[str, dict] = {}
        failed: dict[str, str] = {}

        def run_variant(name: str) -> dict:
            flavour = name[name.index("+"):] if "+" in name else ""
            key, text, overrides = setups[flavour]
            mgr.timeout = left()
            if not name.startswith("cold"):
                return restored(mgr, key, root, cfg_path, overrides, name, left)
            seeded = bool(flavour) and a.precompile_cold == "seeded"
            if seeded:  # cold's live cache as this key's live cache (inductor/triton hit)
                src = os.path.realpath(sn.paths(mgr.tree, key0.key).live)
                p = sn.paths(mgr.tree, key.key)
                gen = p.gen("seed")
                shutil.copytree(src, gen, symlinks=True)
                os.symlink(os.path.relpath(gen, os.path.dirname(p.live)), p.live)
            t0 = time.monotonic()
            del lines[:]
            res = mgr.warm(key, text, overrides, measure=False, fresh=not seeded)
            wall = time.monotonic() - t0
            out = {"seconds": res.cold_s, "records": res.records, "counters": res.counters,
                   "build_models_s": {}, "wall_s": round(wall, 2), "seeded": seeded,
                   "snapshot_bytes": res.snapshot_size}
            out.update(_cold_extras(lines))
            return out

        for name in variants:
            need = name.replace("restored", "cold")
            if need != name and need in failed:
                print(f"-- {name}: skipped ({need} failed)", flush=True)
                continue
            try:
                results[name] = run_variant(name)
            except (Exception, SystemExit) as e:  # noqa: BLE001 - report it, go on with the others
                failed[name] = f"{type(e).__name__}: {e}"[:500]
                print(f"-- {name}: FAILED: {failed[name]}", flush=True)
                continue
            print_variant(name + (" (seeded from cold: NOT a cold start)" if results[name]["seeded"] else ""),
                          results[name])

        ratios = {}
        cold = results.get("cold")
        for name, v in results.items():
            if not name.startswith("restored") or not cold:
                continue
            r = v["seconds"] / cold["seconds"] if cold["seconds"] else float("nan")
            ratios[f"{name}/cold"] = round(r, 4)
            line = f"ratio {name} / cold: {v['seconds']:.2f}/{cold['seconds']:.2f} = {r:.1%}"
            own = results.get(name.replace("restored", "cold"))
            if own is not None and own is not cold and not own.get("seeded"):
                ratios[f"{name}/{name.replace('restored', 'cold')}"] = round(v["seconds"] / own["seconds"], 4)
                line += f"; / its own cold {v['seconds'] / own['seconds']:.1%}"
            print(line + f" (aim <= 20%: {'met' if r <= 0.20 else 'NOT met'})")
        out = {"device": a.device, "key": key0.key, "torch": key0.components["torch.__version__"],
               "gpu": key0.components["gpu"], "precompile_cold": a.precompile_cold, "ratios": ratios,
               "variants": {n: {k: v.get(k) for k in ("seconds", "wall_s", "build_models_s", "phases",
                                                       "counters", "seeded", "snapshot_bytes",
                                                       "restore_s", "seed_s")}
                            for n, v in results.items()},
               "failed": failed, "total_s": round(time.monotonic() - t_start, 1)}
        if cold and "restored" in results:  # the original BENCH fields
            out.update(cold_s=cold["seconds"], warm_s=results["restored"]["seconds"],
                       ratio=ratios.get("restored/cold"))
        print("BENCH " + json.dumps(out), flush=True)
        return 1 if failed else 0
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


def _cold_extras(lines: list[str]) -> dict:
    """From the cold warm-up's output (its report is not kept): build_models seconds and the
    per-shape phase lines, printed as they came."""
    import re

    out: dict = {"build_models_s": {}, "phase_lines": [ln for ln in lines if "phases" in ln]}
    for ln in lines:
        m = re.match(r"warmup: build_models ([0-9.]+) s", ln)
        if m:
            out["build_models_s"] = {"all": float(m.group(1))}
    return out


def restored(mgr, key, root: Path, cfg_path: Path, overrides, name: str, left) -> dict:
    """Wipe the key's live cache, restore its verified snapshot, run the warm-up in a fresh
    process on a run copy."""
    p = sn.paths(mgr.tree, key.key)
    shutil.rmtree(os.path.realpath(p.live))
    os.unlink(p.live)
    t0 = time.monotonic()
    mgr.restore_from_store(key)
    restore_s = time.monotonic() - t0
    run = root / "runs" / name.replace("+", "-")
    t0 = time.monotonic()
    for argv in sn.seed_run_cache_argvs(mgr.tree, key.key, str(run)):
        subprocess.run(argv, check=True, timeout=left())
    seed_s = time.monotonic() - t0
    report = run / "report.json"
    t0 = time.monotonic()
    r = subprocess.run(warmup_argv(str(root / "envs/current/bin/python"), str(cfg_path), overrides, str(report)),
                       env=dict(os.environ, **sn.cache_env(mgr.tree, key.key, str(run))),
                       capture_output=True, text=True, timeout=left())
    wall = time.monotonic() - t0
    if r.returncode != 0:
        print((r.stdout + r.stderr)[-3000:], file=sys.stderr)
        raise SystemExit(f"bench: the {name} warm-up exited {r.returncode}")
    rep = json.loads(report.read_text())
    recs, tot, secs = parse_report(report.read_bytes())
    return {"seconds": secs, "records": rep["records"], "counters": tot, "wall_s": round(wall, 2),
            "seeded": False,
            "build_models_s": rep.get("build_models_s", {}), "phases": rep.get("phases", {}),
            "autograd_bypass_reasons": rep.get("autograd_bypass_reasons") or [],
            "precompile_check": rep.get("precompile_check") or {},
            "restore_s": round(restore_s, 2), "seed_s": round(seed_s, 2)}


if __name__ == "__main__":
    sys.exit(main())
