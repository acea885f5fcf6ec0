"""GPU benchmark of one DFlash drafter training step: flex-compiled against sdpa.

    python -m trainer.bench                      # H200 shape: Qwen3-4B-shaped random target,
                                                 # 5-layer drafter, S=3072, 512 anchors, B=16
    python -m trainer.bench --quick              # tiny shapes, runs on CPU (smoke test)
    python -m trainer.bench --variants flex-compiled,sdpa --json out.json
    python -m trainer.bench --target qwen3-8b --seq-len 768 --anchors 256   # SpecForge's shape

    python -m trainer.bench --methods dflash,dflash2 --variants flex-compiled   # side by side

Methods (``--methods``, comma-separated; default dflash): ``dflash``, ``dflash2`` (grouped
dynamic convolutions, path selector, sliding-window draft layers). Each method gets its own
drafter on the same target, batch and target features and runs the same variants and
candidates; with both, the report adds DFlash2/DFlash ratios (step time, FLOPs, TFLOP/s, MFU).

Variants (``--variants``, comma-separated):
  flex-compiled  flex attention; drafter layers + norms + RoPE + chunked CE compiled as one
                 function (compile.enabled), flex lowered inside it
  flex           only flex_attention compiled; the layers run eagerly (the prototype)
  sdpa           dense boolean mask, eager (the safe fallback)
  sdpa-compiled  dense boolean mask, drafter step compiled
On CPU, compiled flex has no backward, so the flex variants are skipped there.

Reported per variant: drafter step time (forward + backward, incl. the block mask build),
optimizer step time, peak memory, tokens/s and samples/s end to end (target forward +
drafter step + optimizer), drafter MFU. The target forward (up to the last tapped layer)
is timed and its MFU reported separately. MFU = model FLOPs / time / peak, peak = 989
TFLOP/s (H200 bf16 dense datasheet) unless ``--peak-tflops``. The FLOP formulas are in
``drafter_flops`` / ``target_flops`` and docs/trainer.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch

from dfo_contract.markers import format_marker
from dfo_contract.trainer_config.methods import DEFAULT_METHOD

from ..compile.target import compile_layers
from ..core.runtime import Runtime
from .flops import H200_BF16_PEAK_TFLOPS, target_flops
from .measure import CANDIDATES, candidate, measure, write_json
from .methods import (apply_method, known_methods, method_report, parse_methods, ratio_markdown, ratios,
                      step_flops)
from .shapes import TARGETS, target_config
from .timing import timeit

VARIANTS = ("flex-compiled", "flex", "sdpa", "sdpa-compiled")


# --------------------------------------------------------------------------- setup

def make_cfg(a):
    from dfo_contract.trainer_config import TrainerConfig

    cfg = TrainerConfig()
    cfg.model.drafter_layers = a.drafter_layers
    cfg.model.block_size = a.block_size
    cfg.model.mask_token_id = a.mask_token_id
    cfg.model.ce_chunk = a.ce_chunk
    cfg.data.path = "<bench>"
    cfg.data.max_seq_len = a.seq_len
    cfg.data.num_anchors = a.anchors
    cfg.train.micro_batch = a.micro_batch
    cfg.compile.gate = False
    cfg.compile.mode = a.compile_mode
    return cfg


def run(a) -> dict:
    from ..model import attention
    from ..core import step as S
    from ..model.target import target_from_config, tiny_qwen3_config

    dev = torch.device("cuda:0" if torch.cuda.is_available() and not a.cpu else "cpu")
    rt = Runtime.create()
    cfg = make_cfg(a)
    dtype = S.compute_dtype(cfg, dev)
    tcfg = tiny_qwen3_config(hidden=64, layers=4, vocab=128) if a.quick else target_config(a.target)
    t0 = time.perf_counter()
    target = target_from_config(tcfg, device=dev, dtype=dtype, num_drafter_layers=a.drafter_layers,
                                tap_ids=[1, 2] if a.quick and a.drafter_layers == 2 else None)
    setup_s = time.perf_counter() - t0
    batch = S.dummy_batch(cfg, a.seq_len, a.anchors, a.micro_batch, dev, seed=0)
    b = batch.anchors.shape[0]
    tfl = target_flops(tcfg, layers_run=target.layers_run, seq_len=a.seq_len, batch=b)
    peak = (a.peak_tflops or (H200_BF16_PEAK_TFLOPS if dev.type == "cuda" else 0.0)) * 1e12

    def mfu(flops, secs):
        return round(flops / secs / peak, 4) if peak else None

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    feats = S.target_features(target, batch, cfg)
    t_target = timeit(lambda: S.target_features(target, batch, cfg), dev, a.iters)
    report = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""),
        "shape": {"seq_len": a.seq_len, "anchors": a.anchors, "block_size": a.block_size,
                  "micro_batch": a.micro_batch, "drafter_layers": a.drafter_layers,
                  "target_layers": tcfg.num_hidden_layers, "target_layers_run": target.layers_run,
                  "tap_ids": target.tap_ids, "hidden": tcfg.hidden_size, "vocab": tcfg.vocab_size},
        "setup_s": round(setup_s, 2),
        "peak_tflops": peak / 1e12 if peak else None,
        "flops": {"target_forward": tfl},
        "target_forward": {"ms": round(t_target * 1e3, 3), "mfu": mfu(tfl, t_target),
                           "tflops": round(tfl / t_target / 1e12, 2)},
        "methods": {},
    }
    if a.compare_mask:  # torch's uncompiled create_block_mask at this shape, for reference
        t_ref = timeit(lambda: attention.reference_block_mask(batch.anchors, batch.anchor_valid,
                                                               a.seq_len, a.block_size), dev, 1)
        t_ours = timeit(lambda: attention.flex_block_mask(batch.anchors, batch.anchor_valid,
                                                           a.seq_len, a.block_size), dev, a.iters)
        report["block_mask"] = {"create_block_mask_uncompiled_ms": round(t_ref * 1e3, 2),
                                "analytic_ms": round(t_ours * 1e3, 3)}
    t_target_c = None
    if a.target_compile:   # the same target, its decoder layers compiled (side by side)
        t0 = time.perf_counter()
        compile_layers(rt.compile, target)
        for _ in range(2):
            S.target_features(target, batch, cfg)
        warm = time.perf_counter() - t0
        t_target_c = timeit(lambda: S.target_features(target, batch, cfg), dev, a.iters)
        report["target_forward_compiled"] = {
            "ms": round(t_target_c * 1e3, 3), "mfu": mfu(tfl, t_target_c),
            "tflops": round(tfl / t_target_c / 1e12, 2), "warmup_s": round(warm, 1),
            "speedup": round(t_target / t_target_c, 3)}
    t_plan = time.perf_counter()
    for method in a.methods:
        bench_method(a, rt, method, dev, target, tcfg, batch, feats, (t_target, t_target_c), peak,
                     t_plan, report)
    first = report["methods"][a.methods[0]]   # the one-method report's keys: the first method's
    report["variants"] = first["variants"]
    report["flops"].update(drafter_step=first["flops"], visible_pairs=first["visible_pairs"])
    report["ratio"] = ratios(report["methods"])
    return report


def bench_method(a, rt: Runtime, method: str, dev, target, tcfg, batch, feats, t_targets, peak, t_plan,
                 report: dict) -> None:
    """Build ``method``'s drafter on ``target`` and measure every variant and candidate with
    it; the results go into ``report["methods"][method]`` (the JSON is rewritten after each)."""
    from ..core import step as S

    t_target, t_target_c = t_targets
    cfg = make_cfg(a)
    apply_method(cfg, a, method)
    cfg.model.attention = "sdpa"
    cfg.compile.enabled = False
    t0 = time.perf_counter()
    _, drafter = S.build_models(cfg, dev, target=target, rt=rt)
    spec = drafter.spec
    dfl, pairs = step_flops(cfg, spec, batch, a.seq_len)
    variants: dict[str, Any] = {}
    out = report["methods"][method] = {"setup_s": round(time.perf_counter() - t0, 2),
                                       "flops": dfl, "visible_pairs": pairs, "variants": variants}
    own = method_report(cfg)
    if own is not None:
        out["config"] = own
    params = drafter.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), fused=dev.type == "cuda")
    plan = [(name, {"variant": name}) for name in a.variants]
    plan += [(f"cand:{c}", {"variant": a.candidate_variant, **candidate(c)}) for c in a.candidates]
    label = f"{method} " if len(a.methods) > 1 else ""
    for name, opts in plan:
        if a.budget_s and time.perf_counter() - t_plan > a.budget_s:
            variants[name] = {"skipped": f"--budget-s {a.budget_s:.0f} spent"}
            continue
        prof = None
        if a.profile:
            import os

            os.makedirs(a.profile, exist_ok=True)
            prof = os.path.join(a.profile, f"{method}-{name.replace(':', '-')}.txt")
        v = variants[name] = measure(a, cfg, dev, target, drafter, opt, tcfg, spec, peak,
                                     batch, feats, t_target, dfl, opts, rt=rt,
                                     profile_to=prof)
        if t_target_c and "drafter_step_ms" in v and "settings" not in v:
            e2e_c = t_target_c + (v["drafter_step_ms"] + v["optimizer_ms"]) / 1e3
            v["tokens_per_s_target_compiled"] = round(a.micro_batch * a.seq_len / e2e_c, 1)
            v["samples_per_s_target_compiled"] = round(a.micro_batch / e2e_c, 3)
        print(f"bench: {label}{name}: " + (
            f"{v['drafter_step_ms']} ms/step, {v['ms_per_sample']} ms/sample, "
            f"MFU {v['drafter_mfu']}, compile+warm-up {v['warmup_s']} s"
            if "drafter_step_ms" in v else str(v.get("skipped") or v.get("error"))), flush=True)
        if a.json:  # after each: a later candidate that runs out of time loses only itself
            write_json(a.json, report)
    del opt, drafter
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def check_agreement(device: str = "cuda:0", *, seq_len: int = 512, anchors: int = 32,
                    block_size: int = 16, hidden: int = 256, layers: int = 2, seed: int = 0,
                    flex_backend: str = "flex") -> dict:
    """flex (compiled) vs sdpa on the same batch: max |diff| of loss and drafter gradients.

    Needs a device where compiled flex has a backward (CUDA). Returns the differences and
    the reference magnitudes; ``ok`` when they agree within bf16/fp32 tolerance.
    """
    from ..core import step as S
    from dfo_contract.trainer_config import TrainerConfig
    from ..model.target import target_from_config, tiny_qwen3_config

    dev = torch.device(device)
    cfg = TrainerConfig()
    cfg.model.drafter_layers, cfg.model.block_size, cfg.model.mask_token_id = layers, block_size, 3
    cfg.data.path, cfg.data.max_seq_len, cfg.data.num_anchors = "<check>", seq_len, anchors
    cfg.compile.enabled, cfg.compile.gate, cfg.model.attention = False, False, "sdpa"
    tcfg = tiny_qwen3_config(hidden=hidden, layers=4, vocab=512, heads=4, kv_heads=2, head_dim=64,
                             intermediate=2 * hidden)
    target = target_from_config(tcfg, device=dev, dtype=S.compute_dtype(cfg, dev),
                                num_drafter_layers=layers, tap_ids=list(range(layers)), seed=seed)
    rt = Runtime.create()
    _, drafter = S.build_models(cfg, dev, target=target, rt=rt)
    batch = S.dummy_batch(cfg, seq_len, anchors, 2, dev, seed=seed)
    batch.anchor_valid[1, -3:] = False
    feats = S.target_features(target, batch, cfg)
    out = {}
    for backend in ("sdpa", flex_backend):
        drafter.attn_backend = backend
        drafter.zero_grad(set_to_none=True)
        loss, _ = S.drafter_loss(drafter, feats, batch, cfg, rt)
        loss.backward()
        out[backend] = (loss.detach().float(), {n: p.grad.detach().float().clone()
                                                for n, p in drafter.named_parameters() if p.grad is not None})
    (ls, gs), (lf, gf) = out["sdpa"], out[flex_backend]
    gdiff = max(float((gs[n] - gf[n]).abs().max() / gs[n].abs().max().clamp(min=1e-12)) for n in gs)
    ldiff = float((ls - lf).abs())
    tol = 5e-2 if S.compute_dtype(cfg, dev) == torch.bfloat16 else 1e-4
    return {"loss_sdpa": float(ls), "loss_flex": float(lf), "loss_abs_diff": ldiff,
            "grad_max_rel_diff": gdiff, "same_params": sorted(gs) == sorted(gf),
            "ok": ldiff <= tol * max(1.0, abs(float(ls))) and gdiff <= tol and sorted(gs) == sorted(gf)}


def markdown(r: dict) -> str:
    s = r["shape"]
    lines = [f"Device: {r['device']}, torch {r['torch']}, {r['dtype']}; target {s['target_layers']} layers "
             f"(runs {s['target_layers_run']}, taps {s['tap_ids']}), hidden {s['hidden']}, vocab {s['vocab']}; "
             f"drafter {s['drafter_layers']} layers; S={s['seq_len']}, anchors={s['anchors']}, "
             f"B={s['block_size']}, micro_batch={s['micro_batch']}.",
             "",
             f"Target forward: {r['target_forward']['ms']} ms, {r['target_forward']['tflops']} TFLOP/s, "
             f"MFU {r['target_forward']['mfu']}" + (
                 f"; BlockMask: analytic {r['block_mask']['analytic_ms']} ms, uncompiled "
                 f"create_block_mask {r['block_mask']['create_block_mask_uncompiled_ms']} ms"
                 if "block_mask" in r else ""),
             "",
             *([f"Target forward, decoder layers compiled: {r['target_forward_compiled']['ms']} ms, "
                f"MFU {r['target_forward_compiled']['mfu']}, "
                f"{r['target_forward_compiled']['speedup']}x eager", ""]
               if "target_forward_compiled" in r else []),
             "| method | variant | drafter step ms | ms/sample | drafter TFLOP/s | drafter MFU | "
             "block mask ms | peak mem GiB | tokens/s (e2e) | samples/s (e2e) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for method, m in r["methods"].items():
        for name, v in m["variants"].items():
            if "drafter_step_ms" not in v:
                lines.append(f"| {method} | {name} | {v.get('skipped') or v.get('error')} | | | | | | | |")
                continue
            mem = f"{v['peak_mem_bytes'] / 2**30:.1f}" if v["peak_mem_bytes"] else "-"
            lines.append(f"| {method} | {name} | {v['drafter_step_ms']} | {v['ms_per_sample']} | "
                         f"{v['drafter_tflops']} | {v['drafter_mfu']} | {v['block_mask_ms']} | {mem} | "
                         f"{v['tokens_per_s']} | {v['samples_per_s']} |")
    lines += ratio_markdown(r.get("ratio") or {}, r["methods"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    ap.add_argument("--cpu", action="store_true", help="run on CPU even when CUDA is available")
    ap.add_argument("--variants", default=None, help=f"comma-separated, from {','.join(VARIANTS)}")
    ap.add_argument("--methods", default=DEFAULT_METHOD,
                    help=f"comma-separated drafters measured side by side, from {','.join(known_methods())} "
                         "(each its own drafter on the same target and batch; with both, the "
                         "DFlash2/DFlash ratios)")
    ap.add_argument("--sliding-window", type=int, default=None,
                    help="DFlash2's draft-layer attention window (default: model.sliding_window's "
                         "2048; 32 with --quick)")
    ap.add_argument("--selector-rank", type=int, default=None,
                    help="DFlash2's path-selector rank (default: model.selector_rank's)")
    ap.add_argument("--selector-top-k", type=int, default=None,
                    help="DFlash2's selector candidates per slot (default: model.selector_top_k's)")
    ap.add_argument("--target", default="qwen3-4b", choices=sorted(TARGETS),
                    help="the target's shape (random weights; default qwen3-4b)")
    ap.add_argument("--target-compile", action="store_true",
                    help="also time the target's forward with its decoder layers compiled "
                         "(trainer.compile.target) and report end to end with it")
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--anchors", type=int, default=None)
    ap.add_argument("--block-size", type=int, default=None)
    ap.add_argument("--drafter-layers", type=int, default=None)
    ap.add_argument("--micro-batch", type=int, default=None,
                    help="sequences per step (default: 4 on a GPU, the shipped H200 config's; "
                         "1 with --quick)")
    ap.add_argument("--ce-chunk", type=int, default=2048)
    ap.add_argument("--mask-token-id", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode of the compiled variants (e.g. max-autotune-no-cudagraphs)")
    ap.add_argument("--candidates", default="",
                    help="comma-separated changes measured after the variants on the same models: "
                         + ", ".join(CANDIDATES) + " (join with '+', e.g. mb2+ce8192)")
    ap.add_argument("--candidate-variant", default="flex-compiled", choices=VARIANTS,
                    help="the variant the candidates change (sdpa-compiled for a CPU smoke test)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="skip the variants/candidates that would start after this many seconds")
    ap.add_argument("--json", default=None, help="also write the report to this file")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="also profile two steps of each variant: a kernel table per method and "
                         "variant in DIR (METHOD-VARIANT.txt)")
    ap.add_argument("--compare-mask", action="store_true",
                    help="also time torch's uncompiled create_block_mask against the analytic build")
    ap.add_argument("--check", action="store_true",
                    help="only compare flex vs sdpa loss and gradients on the GPU, then exit")
    a = ap.parse_args(argv)
    if a.check:
        r = check_agreement()
        print(json.dumps(r))
        return 0 if r["ok"] else 1
    q = a.quick
    if a.micro_batch is None:
        a.micro_batch = 1 if q else 4
    a.seq_len = a.seq_len or (64 if q else 3072)
    a.anchors = a.anchors or (8 if q else 512)
    a.block_size = a.block_size or (8 if q else 16)
    a.drafter_layers = a.drafter_layers or (2 if q else 5)
    a.mask_token_id = a.mask_token_id if a.mask_token_id is not None else (3 if q else 151669)
    a.iters = a.iters or (2 if q else 10)
    a.warmup = a.warmup or (1 if q else 3)
    a.variants = [v.strip() for v in (a.variants or ",".join(VARIANTS[:3])).split(",") if v.strip()]
    a.candidates = [c.strip() for c in a.candidates.split(",") if c.strip()]
    try:
        for c in a.candidates:
            candidate(c)
    except ValueError as e:
        print(f"trainer.bench: {e}", file=sys.stderr)
        return 2
    if q and a.sliding_window is None:
        a.sliding_window = 32
    try:
        a.methods = parse_methods(a.methods)
    except ValueError as e:
        print(f"trainer.bench: {e}", file=sys.stderr)
        return 2
    bad = [v for v in a.variants if v not in VARIANTS]
    if bad:
        print(f"trainer.bench: unknown variant {bad[0]!r} (known: {', '.join(VARIANTS)})", file=sys.stderr)
        return 2
    from ..model.hf_load import quiet_transformers

    quiet_transformers()
    r = run(a)
    print(markdown(r))
    sys.stdout.write(format_marker({"kind": "bench", **r}))
    sys.stdout.flush()
    if a.json:
        write_json(a.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
