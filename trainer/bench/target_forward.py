"""The frozen target's forward (up to the last tapped layer), measured side by side: eager
against its decoder layers compiled, under each causal-attention kernel sdpa offers.

    python -m trainer.bench.target_forward                          # qwen3-4b, S=3072, B=4
    python -m trainer.bench.target_forward --target qwen3-8b --seq-len 768 --micro-batch 16
    python -m trainer.bench.target_forward --quick --cpu            # tiny smoke test

Variants (``--variants``): ``eager`` (how the trainer runs it: transformers' Qwen3 with
sdpa, torch picking the kernel), ``eager-flash`` / ``eager-cudnn`` / ``eager-efficient``
(one sdpa kernel forced), and ``compiled`` / ``compiled-flash`` / ``compiled-cudnn``
(``trainer.compile.target.compile_layers``: each decoder layer's forward through ``torch.compile``, one
graph shared by all layers; the tap hooks stay outside it), and ``eager-fp8`` /
``compiled-fp8`` (``model.target_fp8``: the layers' linears with fp8 weights). Each variant's features are
compared with eager's (relative L2 difference). MFU = model FLOPs (``flops.target_flops``)
/ time / peak. One JSON line (``--json``) and a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import torch

from ..compile.registry import CompileRegistry
from ..compile.target import compile_layers
from .flops import H200_BF16_PEAK_TFLOPS, target_flops
from .shapes import TARGETS, target_config

VARIANTS = ("eager", "eager-flash", "eager-cudnn", "eager-efficient", "compiled",
            "compiled-flash", "compiled-cudnn", "eager-fp8", "compiled-fp8")


def _kernel(name: str):
    """The sdpa kernel a variant forces (a context manager), or none."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = name.split("-", 1)[1] if "-" in name and not name.endswith("-fp8") else None
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    return sdpa_kernel([backends[kind]]) if kind else contextlib.nullcontext()


def _median_ms(fn, dev, iters: int) -> float:
    times = []
    for _ in range(iters):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def run(a) -> dict:
    from ..model.target import target_from_config, tiny_qwen3_config

    dev = torch.device("cuda:0" if torch.cuda.is_available() and not a.cpu else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    tcfg = (tiny_qwen3_config(hidden=64, layers=4, vocab=128, head_dim=16) if a.quick
            else target_config(a.target))
    taps = None if not a.quick else [1, 2]
    peak = (a.peak_tflops or (H200_BF16_PEAK_TFLOPS if dev.type == "cuda" else 0.0)) * 1e12
    report = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""),
              "target": "tiny" if a.quick else a.target, "seq_len": a.seq_len,
              "micro_batch": a.micro_batch, "variants": {}}
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, tcfg.vocab_size, (a.micro_batch, a.seq_len), generator=gen).to(dev)
    ref = None
    registry = CompileRegistry()  # this process's (the bench compiles nothing else)
    for name in a.variants:
        # a fresh target per variant: compiling one must not change another
        target = target_from_config(tcfg, device=dev, dtype=dtype, num_drafter_layers=5 if not
                                    a.quick else 2, tap_ids=taps, seed=0)
        flops = target_flops(tcfg, layers_run=target.layers_run, seq_len=a.seq_len,
                             batch=a.micro_batch)
        report.setdefault("layers_run", target.layers_run)
        report.setdefault("tap_ids", target.tap_ids)
        try:
            t0 = time.perf_counter()
            if name.endswith("-fp8"):
                target.to_fp8()
            if name.startswith("compiled"):
                compile_layers(registry, target)
            with _kernel(name), torch.no_grad():
                for _ in range(a.warmup):
                    out = target.features(ids)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                warm_s = time.perf_counter() - t0
                ms = _median_ms(lambda t=target: t.features(ids), dev, a.iters)
        except Exception as e:  # noqa: BLE001 - a kernel this device lacks: say so, go on
            report["variants"][name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            print(f"target_forward: {name}: {report['variants'][name]['error']}", flush=True)
            continue
        out = out.float()
        if ref is None:
            ref = out
        diff = float((out - ref).norm() / ref.norm().clamp(min=1e-30))
        v = {"ms": round(ms, 3), "tflops": round(flops / (ms / 1e3) / 1e12, 1),
             "mfu": round(flops / (ms / 1e3) / peak, 4) if peak else None,
             "warmup_s": round(warm_s, 1), "rel_diff_vs_first": diff}
        report["variants"][name] = v
        print(f"target_forward: {name}: {v}", flush=True)
        del target
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    base = report["variants"].get(a.variants[0], {}).get("ms")
    for v in report["variants"].values():
        if base and "ms" in v:
            v["speedup_vs_first"] = round(base / v["ms"], 3)
    return report


def table(r: dict) -> str:
    lines = [f"{r['device']}, torch {r['torch']}, {r['dtype']}; target {r['target']} "
             f"(runs {r.get('layers_run')} layers, taps {r.get('tap_ids')}); "
             f"S={r['seq_len']}, micro-batch {r['micro_batch']}",
             "| variant | ms | TFLOP/s | MFU | speed-up | warm-up s | rel diff |",
             "|---|---|---|---|---|---|---|"]
    for name, v in r["variants"].items():
        if "ms" not in v:
            lines.append(f"| {name} | {v['error']} | | | | | |")
            continue
        lines.append(f"| {name} | {v['ms']} | {v['tflops']} | {v['mfu']} | "
                     f"{v.get('speedup_vs_first')} | {v['warmup_s']} | {v['rel_diff_vs_first']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.bench.target_forward",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen3-4b", choices=sorted(TARGETS))
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--micro-batch", type=int, default=None)
    ap.add_argument("--variants", default=None, help=f"comma-separated, from {','.join(VARIANTS)}")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    q = a.quick
    a.seq_len = a.seq_len or (32 if q else 3072)
    a.micro_batch = a.micro_batch or (1 if q else 4)
    a.iters = a.iters or (2 if q else 10)
    a.warmup = a.warmup or (1 if q else 2)
    a.variants = [v.strip() for v in (a.variants or ",".join(VARIANTS)).split(",") if v.strip()]
    bad = [v for v in a.variants if v not in VARIANTS]
    if bad:
        print(f"target_forward: unknown variant {bad[0]!r} (known: {', '.join(VARIANTS)})",
              file=sys.stderr)
        return 2
    from ..model.hf_load import quiet_transformers

    quiet_transformers()
    r = run(a)
    print(table(r))
    if a.json:
        with open(a.json, "w") as f:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
