"""The measuring half of ``python -m trainer.bench`` (trainer.bench.drafter_step): one variant
(or candidate) timed on the process's models, and the candidate table (MFU changes, measured
side by side).

A candidate changes the flex-compiled step: micro-batch, LM-head chunk, inductor settings
(patched only around its own compile and timing) or the compile mode. Each compiles its own
step (the compiled registry and dynamo are reset before and after it); a candidate that
fails or runs out of memory is reported with its error so the others still run.
"""

from __future__ import annotations

import contextlib
import json
import time

import torch

from dfo_contract.fsio import atomic_write_text
from dfo_contract.trainer_config.layers import layer_pattern

from .methods import step_flops
from .timing import sync, timeit

#: ``--candidates``: changes to the flex-compiled step measured side by side with it (for
#: MFU). Combine with '+', e.g. ``mb2+ce8192``. Each runs in this process after the variants,
#: with dynamo reset and its own compile; ``--budget-s`` skips what no longer fits.
CANDIDATES: dict[str, dict] = {
    "base": {},                                                  # flex-compiled again
    "mb1": {"micro_batch": 1},                                   # 1 sequence per step
    "mb2": {"micro_batch": 2},                                   # 2 sequences per step
    "mb4": {"micro_batch": 4},
    "ce4096": {"ce_chunk": 4096},                                # fewer, larger LM-head chunks
    "ce8192": {"ce_chunk": 8192},                                # one chunk at 512 x 15 rows
    "cdt": {"inductor": {"coordinate_descent_tuning": True}},    # tune pointwise/reduction configs
    "gemm": {"inductor": {"max_autotune_gemm": True,             # autotune the matmuls only
                          "max_autotune_gemm_backends": "ATEN,TRITON",
                          "max_autotune_pointwise": False}},
    "cudagraphs": {"mode": "reduce-overhead"},                   # CUDA graphs of the static step
}


def write_json(path: str, report: dict) -> None:
    """The report, atomically (a bench may hold NaN: JSON's non-strict form)."""
    atomic_write_text(path, json.dumps(report, indent=1) + "\n")


def candidate(name: str) -> dict:
    """The settings of ``name`` (a key of CANDIDATES, or several joined with '+')."""
    out: dict = {}
    for part in name.split("+"):
        if part not in CANDIDATES:
            raise ValueError(f"unknown candidate {part!r} (known: {', '.join(CANDIDATES)})")
        for k, v in CANDIDATES[part].items():
            out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) else v
    return out


def reset_compiled(rt) -> None:
    """Forget every function compiled through ``rt`` (a candidate compiles its own)."""
    rt.compile.forget()
    torch._dynamo.reset()


def profile_table(fn, dev, path: str, steps: int = 2, rows: int = 45) -> None:
    """``fn`` run ``steps`` times under torch's profiler; the kernels by device time, a table
    in ``path`` (where the step's time goes: matmuls, flex attention, fused pointwise)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        sync(dev)
    avg = prof.key_averages()
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    try:
        text = avg.table(sort_by=key, row_limit=rows, max_name_column_width=90)
    except (AttributeError, KeyError, ValueError):
        key = key.replace("cuda", "device")
        text = avg.table(sort_by=key, row_limit=rows, max_name_column_width=90)
    atomic_write_text(path, f"{steps} steps, sorted by {key}\n{text}\n")


def measure(a, cfg, dev, target, drafter, opt, tcfg, spec, peak, batch, feats, t_target, dfl,
            opts: dict, *, rt, profile_to: str | None = None) -> dict:
    """Time one variant (optionally changed by a candidate's settings) on this process's models
    (``rt``: its trainer.core.runtime.Runtime); ``profile_to``: also write its kernel table there (``profile_table``)."""
    from ..model import attention
    from ..core import step as S

    name = opts["variant"]
    backend = "flex" if name.startswith("flex") else "sdpa"
    if backend == "flex" and dev.type == "cpu":
        return {"skipped": "compiled flex has no backward on CPU"}
    mb = int(opts.get("micro_batch", a.micro_batch))
    mode = opts.get("mode", a.compile_mode)
    if mode == "reduce-overhead" and dev.type != "cuda":
        return {"skipped": "CUDA graphs need CUDA"}
    drafter.attn_backend = backend
    cfg.compile.enabled = name.endswith("-compiled")
    cfg.model.attention = backend
    cfg.compile.mode = mode
    cfg.model.ce_chunk = int(opts.get("ce_chunk", a.ce_chunk))
    cfg.train.micro_batch = mb
    extra = {k: v for k, v in opts.items() if k != "variant"}
    if extra:
        reset_compiled(rt)
    if mb != a.micro_batch:
        batch = S.dummy_batch(cfg, a.seq_len, a.anchors, mb, dev, seed=0)
        feats = S.target_features(target, batch, cfg)
        t_target = timeit(lambda: S.target_features(target, batch, cfg), dev, max(1, a.iters // 2))
        dfl, _ = step_flops(cfg, spec, batch, a.seq_len)
    b = batch.anchors.shape[0]
    cudagraphs = "reduce-overhead" in mode

    def mfu(flops, secs):
        return round(flops / secs / peak, 4) if peak else None

    def drafter_step():
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        loss, _ = S.drafter_loss(drafter, feats, batch, cfg, rt)
        loss.backward()
        return loss

    ind = opts.get("inductor") or {}
    patch = torch._inductor.config.patch(**ind) if ind else contextlib.nullcontext()
    try:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        with patch:
            tc = time.perf_counter()
            for _ in range(a.warmup):
                drafter_step()
                drafter.zero_grad(set_to_none=False)
            sync(dev)
            first_s = time.perf_counter() - tc
            t_step = timeit(lambda: (drafter_step(), None), dev, a.iters)
            if profile_to:
                profile_table(drafter_step, dev, profile_to)
        t_opt = timeit(lambda: opt.step(), dev, a.iters)
        pattern = layer_pattern(cfg.model)
        t_mask = timeit(lambda: attention.build_masks(backend, batch.anchors, batch.anchor_valid,
                                                       a.seq_len, a.block_size, pattern), dev, a.iters)
        drafter.zero_grad(set_to_none=True)
        peak_mem = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    except torch.OutOfMemoryError as e:
        drafter.zero_grad(set_to_none=True)
        return {"error": f"OOM: {str(e).splitlines()[0]}", **({"settings": extra} if extra else {})}
    except Exception as e:  # noqa: BLE001 - a candidate that fails is reported, the rest run
        if not extra:
            raise
        drafter.zero_grad(set_to_none=True)
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                "settings": extra}
    finally:
        cfg.train.micro_batch, cfg.model.ce_chunk, cfg.compile.mode = (a.micro_batch, a.ce_chunk,
                                                                       a.compile_mode)
        if extra:
            reset_compiled(rt)
    e2e = t_target + t_step + t_opt
    out = {
        "warmup_s": round(first_s, 2),
        "drafter_step_ms": round(t_step * 1e3, 3),
        "optimizer_ms": round(t_opt * 1e3, 3),
        "block_mask_ms": round(t_mask * 1e3, 3),
        "drafter_mfu": mfu(dfl["total"], t_step),
        "drafter_tflops": float(f"{dfl['total'] / t_step / 1e12:.4g}"),   # 4 significant digits
        "drafter_flops": dfl["total"],
        "ms_per_sample": round(t_step * 1e3 / b, 3),
        "peak_mem_bytes": peak_mem,
        "end_to_end_ms": round(e2e * 1e3, 3),
        "tokens_per_s": round(b * a.seq_len / e2e, 1),
        "samples_per_s": round(b / e2e, 3),
    }
    if extra:
        out["settings"] = extra
        out["micro_batch"] = b
    return out
