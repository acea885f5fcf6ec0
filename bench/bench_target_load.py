"""The trainer's model build at a baseline commit against this checkout's, side by side in one run.

    python3 bench/bench_target_load.py [--device cpu] [--repeats 3] [--baseline-ref REF]
                                       [--hidden 1024 --layers 16 --vocab 32000 --taps 2,5,8]
                                       [--qwen3-tokenizer]

Writes a random Qwen3 target (bf16 safetensors; the tiny tokenizer, whose mask token the
trainer finds through the tokenizer, or with ``--qwen3-tokenizer`` Qwen3's own from the
shared fixtures, vocabulary 151936, no mask token) to a temp dir, then, in a
fresh process per figure (each pays its own first reads; the imports are timed apart), with
baseline and current alternated ``--repeats`` times:

- target, baseline: ``from_pretrained`` of every layer, then the layers after the last tap
  dropped and ``.to(device)`` (what ``load_target`` did);
- target, current: ``trainer.model.target.load_target`` (only the layers up to the last tap are
  built and read; straight onto the device when ``accelerate`` is installed);
- drafter, baseline: ``Drafter(...)`` on the CPU, ``init_weights(seed)``, ``.to(device)``;
- drafter, current: ``trainer.model.drafter.build_drafter`` (meta device, then created on the
  device with the same values).

Prints the medians (and minima: a loaded machine adds noise), the ratios current/baseline and each
child's peak RSS. With ``--startup`` (the
default) it also runs ``python -m trainer train`` for one step on that target (compile off),
``--repeats`` times, and prints the medians of the trainer's own ``startup`` phases;
``--baseline-ref REF`` runs the same from a ``git archive`` of REF, alternated with it. The temp dir is removed at the end (``--keep`` keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r'''
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
kind, mode, path, dev, taps = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
t0 = time.perf_counter()
import torch
from torch import nn
from transformers import AutoModelForCausalLM
from trainer.model.hf_load import from_pretrained
from trainer.model.target import Target, load_target
from trainer.model.drafter import Drafter, DrafterSpec, SharedHead, build_drafter
import transformers.models.qwen3.modeling_qwen3  # noqa: F401  (imported by either way)
out = {"import_s": time.perf_counter() - t0}
ids = [int(x) for x in taps.split(",")]
dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
def sync():
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
if dev.startswith("cuda"):
    torch.empty(1, device=dev); sync()
if kind == "target":
    a = time.perf_counter()
    if mode == "baseline":
        t = Target(from_pretrained(path, dtype), ids, path)
        t.model.to(dev)
    else:
        t = load_target(path, device=dev, dtype=dtype, num_drafter_layers=len(ids), tap_ids=ids)
    sync()
    out["seconds"] = time.perf_counter() - a
    out["layers_built"] = len(t.model.model.layers)
    out["num_layers_total"] = t.num_layers_total
else:
    from transformers import AutoConfig
    tcfg = AutoConfig.from_pretrained(path, local_files_only=True)
    spec = DrafterSpec.from_target_config(tcfg, num_layers=len(ids), num_taps=len(ids))
    emb = nn.Embedding(tcfg.vocab_size, tcfg.hidden_size, device=dev)
    head = nn.Linear(tcfg.hidden_size, tcfg.vocab_size, bias=False, device=dev)
    make = lambda: Drafter(spec, SharedHead(emb, head))
    a = time.perf_counter()
    if mode == "baseline":
        d = make(); d.init_weights(0); d.to(dev)
    else:
        d = build_drafter(make, device=dev, seed=0).to(dev)
    sync()
    out["seconds"] = time.perf_counter() - a
    out["params"] = sum(p.numel() for p in d.trainable_parameters())
out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("BENCH_CHILD " + json.dumps(out))
'''


def write_target(out: str, *, hidden: int, layers: int, vocab: int, heads: int, kv_heads: int,
                 head_dim: int, intermediate: int, qwen3_tokenizer: bool) -> float:
    """A random Qwen3 in bf16 and a tokenizer (no mask token hint); its size in MB."""
    import torch
    from transformers import Qwen3ForCausalLM

    from trainer.model.hf_load import quiet_transformers
    from trainer.model.target import tiny_qwen3_config, write_tiny_tokenizer

    quiet_transformers()
    torch.manual_seed(0)
    cfg = tiny_qwen3_config(hidden=hidden, layers=layers, vocab=vocab, heads=heads,
                            kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    del model
    if qwen3_tokenizer:
        from bench_tokenize_qwen3 import make_target

        tok = Path(out) / "qwen3-tokenizer"
        make_target(tok, None, None)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.move(str(tok / f), os.path.join(out, f))
        shutil.rmtree(tok)
    else:
        write_tiny_tokenizer(out, vocab)
    return sum(f.stat().st_size for f in Path(out).glob("*.safetensors")) / 2**20


def child(tree: Path, kind: str, mode: str, target: str, dev: str, taps: str) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, str(tree), kind, mode, target, dev, taps],
                       capture_output=True, text=True, cwd=tree)
    line = [x for x in p.stdout.splitlines() if x.startswith("BENCH_CHILD ")]
    if p.returncode or not line:
        raise SystemExit(f"bench child {kind}/{mode} failed: "
                         + ((p.stderr.strip().splitlines() or ["?"])[-1])[:400])
    return json.loads(line[-1][len("BENCH_CHILD "):])


def startup(tree: Path, target: str, data: str, run_dir: str, dev: str, taps: str) -> dict:
    """One ``python -m trainer train`` step from ``tree``: its ``startup`` marker."""
    from dfo_contract.markers import iter_markers

    args = {"model.target_path": target, "model.drafter_layers": len(taps.split(",")),
            "model.target_layer_ids": f"[{taps}]", "model.block_size": 8,
            "model.attention": "sdpa", "data.path": data, "data.max_seq_len": 64,
            "data.num_anchors": 4, "train.micro_batch": 2, "train.max_steps": 1,
            "compile.enabled": "false", "compile.gate": "false", "run.dir": run_dir,
            "parallel.target_devices": f"[{dev}]", "parallel.drafter_devices": f"[{dev}]"}
    argv = [sys.executable, "-m", "trainer", "train"]
    for k, v in args.items():
        argv += [f"--{k}", str(v)]
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")
    env.pop("DFO_SPAWN_T", None)
    a = time.perf_counter()
    p = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - a
    recs = [m for m in iter_markers(p.stdout.splitlines()) if m.get("kind") == "startup"]
    if p.returncode or not recs:
        raise SystemExit(f"trainer from {tree} failed (exit {p.returncode}): "
                         + ((p.stderr.strip().splitlines() or ["?"])[-1])[:400])
    return {"wall_s": round(wall, 2), "total_s": recs[-1]["total_s"], "phases": recs[-1]["phases"]}


def baseline_tree(ref: str, into: str) -> Path:
    """``git archive`` of ``ref`` unpacked into ``into`` (no git state is changed)."""
    arch = subprocess.run(["git", "archive", ref], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", into], input=arch.stdout, check=True)
    return Path(into)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--taps", default="2,5,8", help="tapped layer ids (the last is the last layer built)")
    ap.add_argument("--qwen3-tokenizer", action="store_true",
                    help="Qwen3's tokenizer (shared fixtures) and vocabulary 151936")
    ap.add_argument("--startup", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--baseline-ref", default=None, help="git ref whose trainer startup runs beside")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if a.qwen3_tokenizer:
        a.vocab = max(a.vocab, 151936)
    work = tempfile.mkdtemp(prefix="dfo-bench-target-")
    try:
        target = os.path.join(work, "target")
        t = time.perf_counter()
        mb = write_target(target, hidden=a.hidden, layers=a.layers, vocab=a.vocab, heads=a.heads,
                          kv_heads=a.kv_heads, head_dim=a.head_dim, intermediate=a.intermediate,
                          qwen3_tokenizer=a.qwen3_tokenizer)
        print(f"target: {a.layers} layers, hidden {a.hidden}, vocab {a.vocab}, {mb:.0f} MB bf16, "
              f"taps {a.taps} (written in {time.perf_counter() - t:.1f} s); device {a.device}")
        res: dict = {"target_mb": round(mb, 1), "device": a.device, "taps": a.taps,
                     "tokenizer": "qwen3" if a.qwen3_tokenizer else "tiny"}
        for kind in ("target", "drafter"):
            runs: dict[str, list[dict]] = {"baseline": [], "current": []}
            for _ in range(a.repeats):
                for mode in ("baseline", "current"):
                    runs[mode].append(child(REPO, kind, mode, target, a.device, a.taps))
            med = {m: statistics.median(r["seconds"] for r in rs) for m, rs in runs.items()}
            low = {m: min(r["seconds"] for r in rs) for m, rs in runs.items()}
            rss = {m: max(r["maxrss_mb"] for r in rs) for m, rs in runs.items()}
            ratio = med["current"] / med["baseline"]
            extra = (f"layers built {runs['baseline'][0]['layers_built']} -> {runs['current'][0]['layers_built']} "
                     f"of {runs['current'][0]['num_layers_total']}" if kind == "target"
                     else f"{runs['current'][0]['params'] / 1e6:.1f} M params")
            print(f"{kind} build: baseline {med['baseline']:.3f} s, current {med['current']:.3f} s, current/baseline "
                  f"{ratio:.3f} (median of {a.repeats}; minima {low['baseline']:.3f} -> "
                  f"{low['current']:.3f} s; peak RSS {rss['baseline']:.0f} -> "
                  f"{rss['current']:.0f} MB; {extra})")
            res[kind] = {"baseline_s": round(med["baseline"], 3), "current_s": round(med["current"], 3),
                         "baseline_min_s": round(low["baseline"], 3), "current_min_s": round(low["current"], 3),
                         "ratio": round(ratio, 3), "maxrss_mb": rss,
                         "all": {m: [round(r["seconds"], 3) for r in rs] for m, rs in runs.items()}}
        if a.startup:
            from trainer.data.synth import write_synth

            data = write_synth(os.path.join(work, "synth.jsonl"), num=8, seq_len=64,
                               vocab=a.vocab, seed=0)
            trees = {"current": REPO}
            if a.baseline_ref:
                trees = {"baseline": baseline_tree(a.baseline_ref, tempfile.mkdtemp(dir=work)), "current": REPO}
            got: dict[str, list[dict]] = {n: [] for n in trees}
            for i in range(a.repeats):
                for name, tree in trees.items():
                    got[name].append(startup(tree, target, data,
                                             os.path.join(work, f"run-{name}-{i}"), a.device, a.taps))
            res["startup"] = {}
            for name, runs in got.items():
                s = {"total_s": statistics.median(r["total_s"] for r in runs),
                     "wall_s": statistics.median(r["wall_s"] for r in runs),
                     "phases": {k: round(statistics.median(r["phases"].get(k, 0.0) for r in runs), 3)
                                for k in runs[0]["phases"]},
                     "all_total_s": [r["total_s"] for r in runs]}
                res["startup"][name] = s
                print(f"trainer startup ({name}, median of {a.repeats}): {s['total_s']:.2f} s to the "
                      "loop, " + ", ".join(f"{k} {v:.2f} s" for k, v in s["phases"].items())
                      + f"; process wall {s['wall_s']:.2f} s")
            if "baseline" in res["startup"]:
                r = res["startup"]["current"]["total_s"] / res["startup"]["baseline"]["total_s"]
                res["startup"]["ratio"] = round(r, 3)
                print(f"trainer startup current/baseline: {r:.3f}")
        print("BENCH " + json.dumps(res))
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))
    finally:
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
