"""ddp scaling of the trainer's real DdpLayout step (aim: >= 95% efficiency at 2 GPUs).

Driver (one command, each world size after the other, a table and a JSON summary):

    python3 bench/bench_ddp.py --worlds 1,2,4 --out ddp.json
    python3 bench/bench_ddp.py --cpu-smoke --worlds 1,2 --out smoke.json   # CPU, gloo, tiny

Worker (what the driver starts for each world size; also runnable by hand):

    torchrun --standalone --nproc-per-node N bench/bench_ddp.py --worker --result r.json ...

Each rank builds the target IN MEMORY (random bf16 weights; default: Qwen3-1.7B-shaped,
hidden 2048, 28 layers, 16 heads, 8 kv heads, head_dim 128, intermediate 6144, vocab 151936),
a 5-layer drafter, and runs what trainer.train.loop runs per optimizer step: the stop vote
(``agree_stop``), ``zero_grad``, ``DdpLayout.grads`` on the step's micro-batches (this rank's
built, the others ``SkippedBatch`` as ``BatchStream.take`` gives them), gradient clipping and
AdamW. Batches are full (S=2048, 256 anchors, micro-batch 1); flex attention + compile on GPU,
sdpa eager on CPU.

Settings, timed one after the other in the same processes: ``accum`` in ``--accums`` (1 = no
accumulation; weak scaling: per-rank work constant, global batch = world x accum) x DDP
settings in ``--grad-dtypes`` / ``--buckets-mb`` (the layout is re-wrapped by
``DdpLayout.wrap``). s/step is the slowest rank's mean; samples/s = world x accum x
micro_batch / (s/step); efficiency = samples/s(N) / (N x samples/s(1)) for the same setting.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

QWEN3_1P7B = dict(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=6144,
                  vocab=151936)
SMOKE = dict(hidden=64, layers=4, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=128)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse(argv):
    ap = argparse.ArgumentParser(prog="bench/bench_ddp.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help="run as one torchrun rank")
    ap.add_argument("--result", default=None, help="worker: rank 0 writes its JSON here")
    ap.add_argument("--worlds", default="1,2", help="driver: world sizes, one after the other")
    ap.add_argument("--out", default=None, help="driver: JSON summary")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shape on CPU with gloo")
    ap.add_argument("--accums", default="1,4", help="grad_accum settings (1 = no accumulation)")
    ap.add_argument("--grad-dtypes", default="fp32", help="parallel.ddp_grad_dtype settings")
    ap.add_argument("--buckets-mb", default="25", help="parallel.ddp_bucket_mb settings")
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--anchors", type=int, default=None)
    ap.add_argument("--drafter-layers", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per setting")
    ap.add_argument("--iters", type=int, default=None, help="timed steps per setting")
    ap.add_argument("--no-compile", action="store_true", help="GPU: sdpa, eager")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="driver: per world size")
    a = ap.parse_args(argv)
    smoke = a.cpu_smoke
    a.shape = SMOKE if smoke else QWEN3_1P7B
    a.seq_len = a.seq_len or (64 if smoke else 2048)
    a.anchors = a.anchors or (8 if smoke else 256)
    if smoke:
        a.block_size = 8 if a.block_size == 16 else a.block_size
        a.drafter_layers = 1 if a.drafter_layers == 5 else a.drafter_layers
    a.warmup = a.warmup if a.warmup is not None else (1 if smoke else 3)
    a.iters = a.iters if a.iters is not None else (2 if smoke else 10)
    return a


# --------------------------------------------------------------------------- worker

def make_cfg(a, cpu: bool):
    from dfo_contract.trainer_config import TrainerConfig

    cfg = TrainerConfig()
    cfg.parallel.layout = "ddp"
    cfg.parallel.drafter_devices = ["cpu"] if cpu else ["cuda"]
    cfg.parallel.target_devices = ["cpu"] if cpu else ["cuda"]
    cfg.model.drafter_layers = a.drafter_layers
    cfg.model.block_size = a.block_size
    cfg.model.mask_token_id = 3 if a.cpu_smoke else 151669
    cfg.model.attention = "sdpa" if (cpu or a.no_compile) else "flex"
    cfg.compile.enabled = not (cpu or a.no_compile)
    cfg.compile.gate = False  # one thread per process; the first steps compile
    cfg.data.path = "<bench>"
    cfg.data.max_seq_len = a.seq_len
    cfg.data.num_anchors = a.anchors
    cfg.train.micro_batch = a.micro_batch
    return cfg


def worker(a) -> int:
    import torch
    import torch.distributed as dist

    from trainer.data.stream import SkippedBatch
    from trainer.core import step as S
    from trainer.parallel.ddp import DdpLayout, my_indices
    from trainer.model.target import target_from_config, tiny_qwen3_config

    cpu = a.cpu_smoke or not torch.cuda.is_available()
    cfg = make_cfg(a, cpu)
    sh = a.shape
    tcfg = tiny_qwen3_config(hidden=sh["hidden"], layers=sh["layers"], vocab=sh["vocab"],
                             heads=sh["heads"], kv_heads=sh["kv_heads"], head_dim=sh["head_dim"],
                             intermediate=sh["intermediate"], max_pos=max(4096, a.seq_len),
                             init_range=0.2 if a.cpu_smoke else 0.02)  # 0.02: HF's, finite in bf16

    def build_target(dev):
        return target_from_config(tcfg, device=dev, dtype=S.compute_dtype(cfg, dev),
                                  num_drafter_layers=a.drafter_layers)

    t0 = time.perf_counter()
    torch.manual_seed(0)
    layout = DdpLayout(cfg, build_target=build_target)
    dev, rank, world = layout.device, layout.rank, layout.world
    setup_s = time.perf_counter() - t0
    params = layout.parameters()
    opt = torch.optim.AdamW(params, lr=1e-5, eps=1e-8)
    n_params = sum(p.numel() for p in params)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def steps(accum: int, count: int) -> float:
        n = accum * world
        mine = set(my_indices(n, rank, world))
        full = [S.dummy_batch(cfg, a.seq_len, a.anchors, a.micro_batch, "cpu", seed=i)
                for i in range(n)]
        batches = [b if i in mine else SkippedBatch(b.num_tokens, b.num_samples)
                   for i, b in enumerate(full)]
        sync()
        t = time.perf_counter()
        for _ in range(count):
            layout.agree_stop(False)
            opt.zero_grad(set_to_none=True)
            layout.grads(batches)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            layout.after_step()
        sync()
        return time.perf_counter() - t

    rows = []
    for grad_dtype in a.grad_dtypes.split(","):
        for bucket in _ints(a.buckets_mb):
            opt.zero_grad(set_to_none=True)  # .grad may be views into the old wrapper's buckets
            layout.ddp = None
            gc.collect()
            layout.ddp = layout.wrap(bucket, grad_dtype)
            for accum in _ints(a.accums):
                tw = time.perf_counter()
                steps(accum, a.warmup)
                warm_s = time.perf_counter() - tw
                took = torch.tensor([steps(accum, a.iters) / a.iters], dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX, group=layout._ctl)
                s_step = float(took.item())
                samples = world * accum * a.micro_batch
                rows.append({"world": world, "accum": accum, "grad_dtype": grad_dtype,
                             "bucket_mb": bucket, "s_per_step": round(s_step, 5),
                             "samples_per_s": round(samples / s_step, 3),
                             "warmup_s": round(warm_s, 2)})
                if rank == 0:
                    print(f"world {world} accum {accum} {grad_dtype} bucket {bucket} MB: "
                          f"{s_step:.4f} s/step, {samples / s_step:.2f} samples/s", flush=True)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    if rank == 0 and a.result:
        with open(a.result, "w") as f:
            name = str(dev) if cpu else torch.cuda.get_device_name(dev)
            json.dump({"world": world, "device": name,
                       "setup_s": round(setup_s, 2), "drafter_params": n_params,
                       "fp32_grad_bytes": 4 * n_params,  # what one fp32 all-reduce moves
                       "peak_mem_bytes": peak, "rows": rows}, f, indent=1)
    layout.close()
    return 0


# --------------------------------------------------------------------------- driver

def _worker_argv(a, world: int, result: str, argv: list[str]) -> list[str]:
    keep, skip = [], {"--worlds", "--out", "--timeout-s"}
    it = iter(argv)
    for x in it:
        name = x.split("=", 1)[0]
        if name in skip:
            if "=" not in x:
                next(it, None)
            continue
        keep.append(x)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(world), os.path.abspath(__file__), "--worker",
            "--result", result, *keep]


def efficiency(rows: list[dict]) -> list[dict]:
    """Add ``efficiency`` = samples/s(N) / (N x samples/s(1)) of the same setting (pure)."""
    base = {(r["accum"], r["grad_dtype"], r["bucket_mb"]): r["samples_per_s"]
            for r in rows if r["world"] == 1}
    out = []
    for r in rows:
        b = base.get((r["accum"], r["grad_dtype"], r["bucket_mb"]))
        eff = round(r["samples_per_s"] / (r["world"] * b), 4) if b else None
        out.append({**r, "efficiency": eff})
    return out


def table(rows: list[dict]) -> str:
    head = f"{'world':>5} {'accum':>5} {'grads':>5} {'bucket':>6} {'s/step':>9} " \
           f"{'samples/s':>10} {'efficiency':>10}"
    lines = [head]
    for r in sorted(rows, key=lambda r: (r["grad_dtype"], r["bucket_mb"], r["accum"], r["world"])):
        eff = "-" if r["efficiency"] is None else f"{100 * r['efficiency']:.1f}%"
        lines.append(f"{r['world']:>5} {r['accum']:>5} {r['grad_dtype']:>5} {r['bucket_mb']:>6} "
                     f"{r['s_per_step']:>9.4f} {r['samples_per_s']:>10.2f} {eff:>10}")
    return "\n".join(lines)


def _run_world(cmd: list[str], env: dict, timeout_s: float, tmp: str) -> tuple[int, str]:
    """torchrun for one world size: stdout passes through, stderr kept (its tail returned);
    past ``timeout_s`` the whole process group (torchrun and its ranks) is killed."""
    err_path = os.path.join(tmp, "stderr.txt")
    with open(err_path, "w") as err:
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=err, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = 124
    with open(err_path, errors="replace") as f:
        text = f.read()[-3000:]
    if rc == 124:
        text += f"\nno result within {timeout_s:.0f} s (killed)"
    return rc, text


def _write_summary(a, rows: list[dict], runs: list[dict]) -> None:
    if not a.out:
        return
    summary = {"shape": {**a.shape, "drafter_layers": a.drafter_layers, "seq_len": a.seq_len,
                         "anchors": a.anchors, "micro_batch": a.micro_batch,
                         "block_size": a.block_size},
               "cpu_smoke": a.cpu_smoke, "warmup": a.warmup, "iters": a.iters,
               "rows": rows, "runs": runs}
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(tmp, a.out)


def driver(a, argv: list[str]) -> int:
    env = dict(os.environ, PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0")
    if a.cpu_smoke:
        env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    rows, runs = [], []
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        for world in _ints(a.worlds):
            result = os.path.join(tmp, f"world{world}.json")
            print(f"== world {world}", flush=True)
            t0 = time.perf_counter()
            rc, err = _run_world(_worker_argv(a, world, result, argv), env, a.timeout_s, tmp)
            run = {"world": world, "rc": rc, "wall_s": round(time.perf_counter() - t0, 1)}
            if rc == 0 and os.path.exists(result):
                with open(result) as f:
                    got = json.load(f)
                rows.extend(got.pop("rows"))
                run.update(got)
            else:
                run["error"] = err[-3000:]
                print(f"world {world}: failed (rc {rc}):\n{err[-3000:]}", file=sys.stderr)
            runs.append(run)
            _write_summary(a, efficiency(rows), runs)  # after each world: a cut run keeps these
    rows = efficiency(rows)
    print(table(rows), flush=True)
    return 0 if all(r["rc"] == 0 for r in runs) else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse(argv)
    return worker(a) if a.worker else driver(a, argv)


if __name__ == "__main__":
    sys.exit(main())
