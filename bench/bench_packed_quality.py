"""Drafter quality, packed rows against bucketed batches, on the tiny taught target (CPU).

    python3 bench/bench_packed_quality.py [--steps 150] [--out DIR]

Teaches a tiny Qwen3 target the stride sequences (``trainer.data.tinylm teach``), has it
generate its own training and held-out data of mixed lengths (greedy continuations of 8 to
56 new tokens, ``tinylm.regenerate``), then trains the same drafter from the same seed twice
for ``--steps`` steps: bucketed (micro-batches of 8 samples, buckets 32/64) and packed (8 rows
of 64 tokens and 16 anchors, ``--data.pack``). Both measure the acceptance length on the
held-out data at the last step (``eval.every``). Prints one table and a JSON line: per mode
the measured acceptance length, the last loss, the samples seen and the pad fraction of the
trained micro-batches. A benchmark, not an assertion: the packed run sees more samples per
step, as packing means to.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    import torch

    from dfo_contract.trainer_config import load_config
    from trainer.data import tinylm
    from trainer.model.target import make_tiny_target
    from trainer.train.loop import train

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="dfo-packed-quality."))
    t0 = time.time()
    target = make_tiny_target(str(work / "target"))
    tinylm.teach(target, steps=300)
    parts = []
    for i, new in enumerate((8, 16, 24, 40, 56)):  # mixed lengths: 12 to 60 tokens
        parts.append(tinylm.regenerate(target, str(work / f"train{i}.jsonl"), num=64, new=new,
                                       seed=10 + i))
        parts.append(tinylm.regenerate(target, str(work / f"held{i}.jsonl"), num=8, new=new,
                                       seed=100 + i))
    train_lines = "".join(Path(p).read_text() for p in parts[0::2])
    held_lines = "".join(Path(p).read_text() for p in parts[1::2])
    (work / "train.jsonl").write_text(train_lines)
    (work / "held.jsonl").write_text(held_lines)
    print(f"target taught and data generated in {time.time() - t0:.0f} s", flush=True)
    common = {"model.target_path": target, "model.drafter_layers": 2,
              "model.target_layer_ids": "[1,2]", "model.block_size": 8, "model.attention": "sdpa",
              "data.path": str(work / "train.jsonl"), "data.eval_path": str(work / "held.jsonl"),
              "data.max_seq_len": 64, "data.num_anchors": 8, "train.micro_batch": 8,
              "train.max_steps": a.steps, "train.lr": 1e-2, "train.log_every": 10,
              "eval.every": a.steps, "compile.enabled": "false", "compile.gate": "false",
              "parallel.target_devices": "[cpu]", "parallel.drafter_devices": "[cpu]"}
    modes = {"bucketed": {"data.seq_buckets": "[32,64]"},
             "packed": {"data.pack": "true", "data.pack_tokens": 64, "data.pack_anchors": 16}}
    results = {}
    for mode, extra in modes.items():
        run = work / f"run-{mode}"
        flags = [x for k, v in {**common, **extra, "run.dir": str(run)}.items()
                 for x in (f"--{k}", str(v))]
        t = time.time()
        assert train(load_config(None, flags), out=io.StringIO()) == 0
        recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
        ev = [r for r in recs if r.get("accept_len") is not None][-1]
        steps = [r for r in recs if r.get("loss") is not None and r.get("step") is not None]
        from bench.bench_trainer import padding  # the same replay as the speed bench

        pad = padding([*flags], a.steps)
        results[mode] = {"accept_len": round(ev["accept_len"], 3), "last_loss": round(steps[-1]["loss"], 4),
                         "samples_per_micro": pad["samples_per_micro"],
                         "pad_fraction": pad["pad_fraction"], "train_s": round(time.time() - t, 1)}
        print(f"{mode}: {results[mode]}", flush=True)
    print("| mode | acceptance length | last loss | samples a micro-batch | pad fraction |")
    print("|---|---|---|---|---|")
    for mode, r in results.items():
        print(f"| {mode} | {r['accept_len']} | {r['last_loss']} | {r['samples_per_micro']} | "
              f"{r['pad_fraction']} |")
    line = json.dumps({"steps": a.steps, "results": results})
    print(line)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        Path(a.out, "packed_quality.json").write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
