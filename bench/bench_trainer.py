"""The real trainer (``python -m trainer train``) at a benchmark shape, variants side by side.

Builds, in a work dir, a random-weight target saved as a transformers directory (default:
the Qwen3-4B shape of ``trainer.bench.shapes``, bf16, 36 layers, taps 1/9/17/25/33 for the
5-layer drafter) and ``trainer.data synth`` tokens (S <= 3072, buckets 1024/2048/3072), then
runs ``python -m trainer train`` once per variant, one after the other, each in a fresh
process, all with one inductor cache that starts empty (``--cache fresh``: an empty one per
variant, every warm-up cold), and prints per variant: steady samples/s, tokens/s (medians
over steps ``--steady-from``..last of ``metrics.jsonl``), peak memory, the start-up to the
training loop (the trainer's ``startup`` marker, with its warm-up phase) and the warm-up's
per-bucket lines.

Variants (``--variants``, comma list of presets, run in that order; the default is DFlash
with the target compiled, then eager, then DFlash2 compiled: on one H200 these three and one
more ran in 562 s, docs/benchmarks.md 2026-12-04):
  dflash-eager      DFlash drafter, target eager
  dflash-compiled   DFlash drafter, ``--compile.target true``
  dflash2-eager     DFlash2 drafter, target eager
  dflash2-compiled  DFlash2 drafter, ``--compile.target true``
  dflash-fp8        DFlash drafter, the target compiled with fp8 weights (``--model.target_fp8``)
  dflash-packed     DFlash drafter, target compiled, packed rows (``--data.pack``: rows of
                    ``--pack-tokens`` tokens and ``--pack-anchors`` anchors, ``--pack-micro-batch``
                    rows a micro-batch)
  dflash2-packed    the same with the DFlash2 drafter
and any number of ``--variant LABEL='--section.key value ...'`` (trainer flags added to the
common ones), run after the presets.

  python3 bench/bench_trainer.py --out /tmp/bt                           # on one GPU
  python3 bench/bench_trainer.py --variants dflash-compiled --variant 'x=--compile.target true ...'
  python3 bench/bench_trainer.py --cpu-smoke --out /tmp/bt               # tiny target on the CPU
  python3 bench/bench_trainer.py --lengths bench/results/qwen3-chat-lengths.json \
      --variants dflash-compiled,dflash-packed                            # realistic lengths

``--lengths FILE`` (``bench/chat_lengths.py`` writes one: Qwen3's template and tokenizer over
generated multi-turn chats) makes the data with exactly those sample lengths and loss masks
(the tokens are synth's learnable sequences) instead of uniform 1536-3072-token samples. Each
variant's padding is counted by replaying its data stream over the micro-batches it trains
(no model): the pad fraction (pad tokens over all tokens in its micro-batches) and the anchor
slots used; with the trainer's steady real tokens/s they are in the table.

Files in ``--out``: ``trainer_bench.json`` (every figure, rewritten after each variant) and
``<label>.log`` per variant (the trainer's stdout and stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PRESETS = {
    "dflash-eager": ["--model.method", "dflash", "--compile.target", "false"],
    "dflash-compiled": ["--model.method", "dflash", "--compile.target", "true"],
    "dflash2-eager": ["--model.method", "dflash2", "--compile.target", "false"],
    "dflash2-compiled": ["--model.method", "dflash2", "--compile.target", "true"],
    "dflash-fp8": ["--model.method", "dflash", "--compile.target", "true",
                   "--model.target_fp8", "true"],
    "dflash-packed": ["--model.method", "dflash", "--compile.target", "true", "PACK"],
    "dflash2-packed": ["--model.method", "dflash2", "--compile.target", "true", "PACK"],
}


def pack_flags(a) -> list[str]:
    return ["--data.pack", "true", "--data.pack_tokens", str(a.pack_tokens),
            "--data.pack_anchors", str(a.pack_anchors), "--train.micro_batch",
            str(a.pack_micro_batch)]


def write_lengths_data(src: Path, out: Path, vocab: int, seed: int = 0) -> dict:
    """Learnable synthetic tokens with the sample lengths and loss masks of ``src``."""
    import random

    spec = json.loads(src.read_text())
    rng = random.Random(f"dfo-bench-lengths:{seed}")
    span = vocab - 4
    with open(out, "w") as f:
        for n, spans in spec["samples"]:
            stride, x, ids = rng.randint(1, 3), rng.randrange(span), []
            for _ in range(n):
                ids.append(4 + x)
                x = rng.randrange(span) if rng.random() < 0.03 else (x + stride) % span
            mask = [0] * n
            for lo, hi in spans:
                mask[lo:hi] = [1] * (hi - lo)
            f.write(json.dumps({"input_ids": ids, "loss_mask": mask}, separators=(",", ":")) + "\n")
    return {"source": spec.get("source"), "quantiles": spec.get("quantiles"),
            "samples": len(spec["samples"])}


def padding(args: list[str], micro_batches: int) -> dict:
    """Replay the data stream of a variant's trainer flags over ``micro_batches`` micro-batches
    (no model): pad tokens over all tokens, anchor slots used, samples."""
    from dfo_contract.trainer_config import load_config
    from trainer.data.datasets import open_dataset
    from trainer.data.stream import stream_for

    cfg = load_config(None, args)
    vocab = json.loads(Path(cfg.model.target_path, "config.json").read_text())["vocab_size"]
    ds = open_dataset(cfg.data.path, vocab_size=vocab, block_size=cfg.model.block_size,
                      max_seq_len=cfg.data.max_seq_len, min_loss_tokens=cfg.min_loss_tokens(),
                      fmt="tokens", tokenizer=None, mask_token_id=MASK_ID)
    st = stream_for(ds, cfg)
    total = real = slots = used = samples = 0
    for _ in range(micro_batches):
        b = st.next()
        total += b.input_ids.numel()
        real += b.num_tokens
        slots += b.anchor_valid.numel()
        used += int(b.anchor_valid.sum())
        samples += b.num_samples
    return {"pad_fraction": round(1 - real / total, 4), "anchor_slots_used": round(used / slots, 4),
            "tokens_per_micro": round(total / micro_batches), "samples_per_micro":
            round(samples / micro_batches, 2)}
MASK_ID = 3  # synth leaves ids below 4 unused


def make_target(out: Path, *, cpu: bool) -> float:
    """A random-weight target directory; returns the seconds it took."""
    t0 = time.perf_counter()
    if cpu:
        subprocess.run([sys.executable, "-m", "trainer.model.target", "--out", str(out), "--hidden", "128",
                        "--layers", "6", "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
                        "--intermediate", "256", "--vocab", "512", "--no-tokenizer"],
                       check=True, cwd=REPO, timeout=600)
    else:
        import torch
        from transformers import Qwen3ForCausalLM

        from trainer.bench.shapes import target_config

        torch.manual_seed(0)
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(target_config("qwen3-4b")).to(torch.bfloat16)
        model.save_pretrained(str(out))
        del model
        torch.cuda.empty_cache()
    (out / "dfo_target.json").write_text(json.dumps({"kind": "random-bench", "mask_token_id": MASK_ID}))
    return time.perf_counter() - t0


def common_args(a, target: Path, data: Path) -> list[str]:
    return ["--model.target_path", str(target), "--data.path", str(data),
            "--data.max_seq_len", str(a.seq_len), "--data.seq_buckets", a.seq_buckets,
            "--data.num_anchors", str(a.anchors), "--model.block_size", str(a.block_size),
            "--train.micro_batch", str(a.micro_batch), "--train.grad_accum", str(a.grad_accum),
            "--train.max_steps", str(a.steps), "--train.log_every", "1",
            "--parallel.layout", "single", "--checkpoint.save_final", "false",
            *(["--parallel.target_devices", "cpu", "--parallel.drafter_devices", "cpu",
               "--model.attention", "sdpa", "--model.drafter_layers", "2"] if a.cpu_smoke else [])]


def steady(recs: list[dict], start: int) -> dict:
    train = [r for r in recs if r.get("phase", "train") == "train" and r.get("step") is not None
             and r.get("samples_per_s") is not None]
    use = [r for r in train if r["step"] >= start] or train[-1:]

    def med(k):
        vals = [r[k] for r in use if r.get(k) is not None]
        return statistics.median(vals) if vals else None
    peaks = [r["peak_mem_bytes"] for r in train if r.get("peak_mem_bytes") is not None]
    return {"steps": [use[0]["step"], use[-1]["step"]] if use else None,
            "samples_per_s": med("samples_per_s"), "tokens_per_s": med("tokens_per_s"),
            "peak_mem_gib": max(peaks) / 2**30 if peaks else None,
            "last_loss": train[-1]["loss"] if train else None}


def run_variant(a, label: str, flags: list[str], base: list[str], work: Path, cap_s: float) -> dict:
    run_dir = work / f"run-{label}"
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(work / ("ind" if a.cache == "shared" else f"ind-{label}"))
    env.pop("DFO_SPAWN_T", None)
    cmd = [sys.executable, "-m", "trainer", "train", *base, "--run.dir", str(run_dir), *flags]
    log_path = Path(a.out) / (re.sub(r"[^A-Za-z0-9._-]", "_", label) + ".log")
    print(f"== {label} (limit {cap_s:.0f} s): {shlex.join(cmd[1:])}", flush=True)
    t0 = time.time()
    first_step_t = startup = None
    warm_lines: list[str] = []
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, bufsize=1)
        try:
            deadline = t0 + cap_s
            for line in p.stdout:
                log.write(line)
                if line.startswith("@dfo "):
                    try:
                        m = json.loads(line[5:])
                    except ValueError:
                        continue
                    if m.get("kind") == "startup":
                        startup = m
                    elif m.get("kind") == "step" and first_step_t is None:
                        first_step_t = m.get("t", time.time())
                elif line.startswith(("warmup:", "compile:", "startup:")):
                    warm_lines.append(line.rstrip())
                    print("   " + line.rstrip(), flush=True)
                if time.time() > deadline:
                    p.kill()
                    break
        finally:
            try:
                rc = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
    wall = time.time() - t0
    mpath = run_dir / "metrics.jsonl"
    recs = []
    if mpath.is_file():
        for ln in mpath.read_text().splitlines():
            try:
                recs.append(json.loads(ln))
            except ValueError:
                pass
    res = {"label": label, "flags": flags, "rc": rc, "wall_s": round(wall, 1),
           "to_first_step_s": round(first_step_t - t0, 1) if first_step_t else None,
           "startup": {k: startup.get(k) for k in ("total_s", "phases")} if startup else None,
           "warmup_lines": warm_lines, **steady(recs, a.steady_from)}
    print(f"== {label}: rc {rc}, {wall:.0f} s, first step at {res['to_first_step_s']} s, "
          f"steady {res['samples_per_s']} samples/s over steps {res['steps']}", flush=True)
    if rc != 0:
        tail = log_path.read_text().splitlines()[-15:]
        print("   " + "\n   ".join(tail), flush=True)
    return res


def table(results: list[dict]) -> str:
    base = results[0]["samples_per_s"] if results and results[0]["samples_per_s"] else None
    rows = ["| variant | samples/s | vs first | real tokens/s | pad | anchors used | peak GiB | "
            "to first step s | warm-up s | steps | rc |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        sps = r["samples_per_s"]
        warm = (r["startup"] or {}).get("phases", {}).get("warm-up")

        def f(x, p=2):
            return "-" if x is None else f"{x:.{p}f}"
        pad = r.get("padding") or {}
        rows.append(f"| {r['label']} | {f(sps)} | {f(sps / base if sps and base else None)}x | "
                    f"{f(r['tokens_per_s'], 0)} | {f(pad.get('pad_fraction'), 3)} | "
                    f"{f(pad.get('anchor_slots_used'), 3)} | {f(r['peak_mem_gib'], 1)} | "
                    f"{f(r['to_first_step_s'], 1)} | {f(warm, 1)} | {r['steps']} | {r['rc']} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/bench_trainer")
    ap.add_argument("--workdir", default="", help="target, data, runs, caches (default: a temp dir, removed)")
    ap.add_argument("--variants", default="dflash-compiled,dflash-eager,dflash2-compiled")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL=FLAGS")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--steady-from", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=3072)
    ap.add_argument("--seq-buckets", default="1024,2048,3072")
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--cache", choices=["fresh", "shared"], default="shared",
                    help="fresh: an empty inductor cache per variant (cold warm-ups); shared: one")
    ap.add_argument("--budget-s", type=float, default=570, help="all variants together")
    ap.add_argument("--cap-s", type=float, default=300, help="one variant at most")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny target on the CPU (checks the script)")
    ap.add_argument("--lengths", default="", help="sample lengths and loss masks (bench/chat_lengths.py)")
    ap.add_argument("--pack-tokens", type=int, default=0, help="packed variants: tokens a row "
                    "(0: --seq-len)")
    ap.add_argument("--pack-anchors", type=int, default=0, help="packed variants: anchors a row "
                    "(0: --anchors x --micro-batch)")
    ap.add_argument("--pack-micro-batch", type=int, default=1, help="packed variants: rows a micro-batch")
    a = ap.parse_args(argv)
    if a.cpu_smoke and a.seq_len == 3072:
        a.seq_len, a.seq_buckets, a.anchors, a.block_size = 64, "32,64", 8, 4
        a.micro_batch, a.grad_accum, a.samples = 2, 1, 64
        a.steps, a.steady_from = min(a.steps, 6), min(a.steady_from, 3)
    a.pack_tokens = a.pack_tokens or a.seq_len
    a.pack_anchors = a.pack_anchors or a.anchors * a.micro_batch
    t_start = time.time()
    variants = []
    for name in filter(None, a.variants.split(",")):
        if name not in PRESETS:
            ap.error(f"--variants: unknown {name!r} (known: {', '.join(PRESETS)})")
        variants.append((name, [f for p in PRESETS[name] for f in (pack_flags(a) if p == "PACK" else [p])]))
    for v in a.variant:
        label, _, flags = v.partition("=")
        variants.append((label, shlex.split(flags)))
    Path(a.out).mkdir(parents=True, exist_ok=True)
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="dfo-bench-trainer."))
    work.mkdir(parents=True, exist_ok=True)
    info = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        import torch
        import transformers

        info |= {"torch": torch.__version__, "transformers": transformers.__version__,
                 "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
        print(" ".join(f"{k} {v}" for k, v in info.items()), flush=True)
        target, data = work / "target", work / "data.jsonl"
        if not (target / "config.json").is_file():
            info["target_build_s"] = round(make_target(target, cpu=a.cpu_smoke), 1)
        vocab = json.loads((target / "config.json").read_text())["vocab_size"]
        t0 = time.perf_counter()
        if a.lengths:
            info["lengths"] = write_lengths_data(Path(a.lengths), data, vocab)
        else:
            subprocess.run([sys.executable, "-m", "trainer.data", "synth", "--out", str(data), "--num",
                            str(a.samples), "--seq-len", str(a.seq_len), "--vocab", str(vocab)],
                           check=True, cwd=REPO, timeout=600,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
        info["data_s"] = round(time.perf_counter() - t0, 1)
        print(f"target {info.get('target_build_s', 'reused')} s, data {info['data_s']} s", flush=True)
        base = common_args(a, target, data)
        results = []
        for label, flags in variants:
            left = a.budget_s - (time.time() - t_start) - 10
            if left < 60:
                print(f"== {label}: skipped ({left:.0f} s left)", flush=True)
                continue
            res = run_variant(a, label, flags, base, work, min(a.cap_s, left))
            res["padding"] = padding([*base, "--run.dir", str(work / "pad"), *flags],
                                     a.steps * a.grad_accum)
            print(f"   padding: {res['padding']}", flush=True)
            results.append(res)
            Path(a.out, "trainer_bench.json").write_text(json.dumps(
                {"info": info, "args": vars(a), "results": results}, indent=1))
        print(table(results))
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
