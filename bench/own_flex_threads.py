"""Your own trainer (not dfo's): several threads each lazily compiling flex_attention
forward and backward for new shapes, the threaded lazy-compile race's pattern
(docs/recovery.md). For bench_own.py.

    python bench/own_flex_threads.py --threads 4 --steps 40 --ckpt DIR [--resume DIR/step_N]
    python bench/own_flex_threads.py --warm-only --threads 1 ...   # single-threaded warm-up

Each step, every thread runs torch.compile(flex_attention) forward+backward on its own
sequence length (a new shape for most steps, so compiles happen lazily, concurrently, on
a cold cache unless warmed). Prints ``step N loss L tok/s T``; saves ``CKPT/step_N`` (the
step number and the weights) every 5 steps. On a real GPU the concurrent compiles can hang
or raise; dfo's supervisor is meant to see it from this output or its silence.
"""

import argparse
import os
import threading
import time

import torch
from torch.nn.attention.flex_attention import flex_attention

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=4)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--ckpt", required=True)
ap.add_argument("--resume")
ap.add_argument("--device", default="cuda")
ap.add_argument("--shapes", type=int, default=8, help="distinct sequence lengths")
ap.add_argument("--heads", type=int, default=8)
ap.add_argument("--dim", type=int, default=64)
ap.add_argument("--no-compile", action="store_true", help="eager flex")
ap.add_argument("--warm-only", action="store_true", help="compile every shape once, then exit")
a = ap.parse_args()
os.makedirs(a.ckpt, exist_ok=True)
dev = torch.device(a.device)
dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
if dev.type == "cpu":   # flex has no backward on CPU: SDPA, only to check the plumbing
    attn = torch.nn.functional.scaled_dot_product_attention
else:
    attn = flex_attention if a.no_compile else torch.compile(flex_attention, dynamic=False)
H, D = a.heads, a.dim
proj = torch.nn.Linear(D * H, 3 * D * H, device=dev, dtype=dt)
opt = torch.optim.SGD(proj.parameters(), lr=1e-3)
lock = threading.Lock()


def seq_len(step: int, k: int) -> int:
    return 128 * (1 + (step * max(a.threads, 1) + k) % a.shapes)


def work(step: int, k: int, out: list) -> None:
    L = seq_len(step, k)
    x = torch.randn(1, L, D * H, device=dev, dtype=dt)
    q, kk, v = proj(x).view(1, L, 3, H, D).permute(2, 0, 3, 1, 4)
    y = attn(q.contiguous(), kk.contiguous(), v.contiguous())
    loss = y.float().pow(2).mean()
    loss.backward()
    out[k] = (float(loss), L)


def one_step(step: int) -> tuple[float, int]:
    out: list = [None] * a.threads
    errs: list = []

    def run(k):
        try:
            work(step, k, out)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errs.append(e)

    ts = [threading.Thread(target=run, args=(k,), name=f"drafter-{k}") for k in range(a.threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]
    with lock:
        opt.step()
        opt.zero_grad(set_to_none=True)
    return sum(o[0] for o in out) / len(out), sum(o[1] for o in out)


if a.warm_only:
    t0 = time.perf_counter()
    for s in range(a.shapes):
        L = 128 * (1 + s)
        x = torch.randn(1, L, D * H, device=dev, dtype=dt)
        q, kk, v = proj(x).view(1, L, 3, H, D).permute(2, 0, 3, 1, 4)
        attn(q.contiguous(), kk.contiguous(), v.contiguous()).float().sum().backward()
        print(f"warm-up: shape {L} compiled ({time.perf_counter() - t0:.1f}s)", flush=True)
    opt.zero_grad(set_to_none=True)
    raise SystemExit(0)

start = 0
if a.resume:
    st = torch.load(a.resume, map_location=dev)
    proj.load_state_dict(st["proj"])
    start = int(st["step"])
    print(f"resumed from {a.resume} at step {start}", flush=True)
for step in range(start + 1, a.steps + 1):
    t0 = time.perf_counter()
    loss, toks = one_step(step)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    el = time.perf_counter() - t0
    print(f"step {step} loss {loss:.5f} tok/s {toks / el:.1f}", flush=True)
    if step % 5 == 0:
        tmp = os.path.join(a.ckpt, f".step_{step}.tmp")
        torch.save({"step": step, "proj": proj.state_dict()}, tmp)
        os.replace(tmp, os.path.join(a.ckpt, f"step_{step}"))
print("training done", flush=True)
