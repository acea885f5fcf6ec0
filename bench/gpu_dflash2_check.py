"""DFlash2 on one GPU: the compiled flex path trains like the sdpa path (same seed, same data).

    OUT=/some/dir python3 bench/gpu_dflash2_check.py [--steps 40] [--window 64]

A random Qwen3-shaped target (hidden 256, 4 layers, vocab 1024) and synthetic data; two
``model.method: dflash2`` runs of ``--steps`` steps with 2 drafter layers, B=8, S=256,
32 anchors and a sliding window of ``--window`` (short enough to cut the context):
``model.attention flex`` with ``compile.enabled true`` and ``model.attention sdpa``
uncompiled. Prints both loss curves, their largest difference and tokens/s per step,
and writes ``gpu_dflash2_check.json`` to ``$OUT``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run(target, data, run_dir, steps, window, attn, compiled):
    from tests.helpers.trainer import tiny_config
    from trainer.train.loop import train

    cfg = tiny_config(target, data, run_dir, **{
        "model.method": "dflash2", "model.drafter_layers": 2, "model.target_layer_ids": "[1,2]",
        "model.attention": attn, "compile.enabled": str(compiled).lower(),
        "model.sliding_window": window, "model.selector_rank": 32, "model.selector_top_k": 16,
        "data.max_seq_len": 256, "data.num_anchors": 32, "train.micro_batch": 4,
        "train.max_steps": steps, "train.lr": 3e-3, "checkpoint.every": 0,
        "checkpoint.save_final": "false", "model.dtype": "fp32",
        "parallel.target_devices": "[cuda:0]", "parallel.drafter_devices": "[cuda:0]"})
    assert train(cfg, out=io.StringIO()) == 0
    recs = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if r.get("phase") == "train"]
    return {"loss": [r["loss"] for r in recs], "tokens_per_s": [r.get("tokens_per_s") for r in recs]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--window", type=int, default=64)
    a = ap.parse_args()
    import torch

    from trainer.data.synth import write_synth
    from trainer.model.target import make_tiny_target

    out = os.environ.get("OUT") or "/tmp"
    with tempfile.TemporaryDirectory() as tmp:
        target = make_tiny_target(os.path.join(tmp, "t"), hidden=256, layers=4, vocab=1024,
                                  heads=4, kv_heads=2, head_dim=64, intermediate=512)
        data = write_synth(os.path.join(tmp, "d.jsonl"), num=256, seq_len=256, vocab=1024, seed=0)
        res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "flex_compiled": run(target, data, os.path.join(tmp, "flex"), a.steps, a.window,
                                    "flex", True),
               "sdpa_eager": run(target, data, os.path.join(tmp, "sdpa"), a.steps, a.window,
                                 "sdpa", False)}
    f, s = res["flex_compiled"]["loss"], res["sdpa_eager"]["loss"]
    res["max_loss_diff"] = max(abs(x - y) for x, y in zip(f, s, strict=True))
    print(json.dumps(res["gpu"]), res["torch"])
    for i in range(0, len(f), max(1, len(f) // 8)):
        print(f"step {i + 1:>3}: flex+compile {f[i]:.4f}  sdpa {s[i]:.4f}")
    print(f"last: flex+compile {f[-1]:.4f}  sdpa {s[-1]:.4f}; max |diff| {res['max_loss_diff']:.2e}")
    with open(os.path.join(out, "gpu_dflash2_check.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
