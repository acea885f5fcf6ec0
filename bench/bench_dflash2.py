"""DFlash vs DFlash2 on a tiny teachable target (CPU): measured acceptance length, side by side.

DFlash2 runs twice: with its window layers bidirectional within the block (the default,
what the engines serve from ``is_causal: false``) and causal within the block
(``model.is_causal: true``, served from ``is_causal: true``); each is measured with the
attention its export declares.

    python3 bench/bench_dflash2.py [--steps 400] [--layers 1] [--seed 0] [--out DIR]

Builds a tiny Qwen3 target, teaches it the stride sequences (``trainer.data.tinylm teach``),
regenerates training and held-out data with it (greedy), then trains a DFlash and a DFlash2
drafter with the same data, seed, steps, block size (8) and optimizer settings, evaluating
both on the same held-out blocks every ``--steps/4`` steps. The acceptance length is the
trainer's ``accept_len`` (``trainer.evaluate.accept``: 1 + leading correct draft tokens per
block; DFlash2's draft is its selector's greedy path). Prints a table and writes
``bench_dflash2.json`` to ``--out`` (default ``$OUT`` or ``bench/results``). No network.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DFLASH2 = {"model.method": "dflash2", "model.conv_kernel_size": 2, "model.conv_group_size": 16,
           "model.selector_rank": 16, "model.selector_top_k": 16, "model.sliding_window": 2048}


VARIANTS = (("dflash", {}), ("dflash2", DFLASH2),
            ("dflash2-causal", {**DFLASH2, "model.is_causal": "true"}))
#: ``--variants`` may also name these (not run by default)
EXTRA = {"dflash-fp8": {"model.target_fp8": "true"}}


def train_one(target: str, train_data: str, eval_data: str, run_dir: str, *, steps: int,
              layers: int, seed: int, extra: dict) -> dict:
    from tests.helpers.trainer import tiny_config
    from trainer.train.loop import train

    cfg = tiny_config(target, train_data, run_dir, **{
        "data.eval_path": eval_data, "eval.every": max(1, steps // 4), "train.max_steps": steps,
        "train.log_every": max(1, steps // 4), "model.drafter_layers": layers,
        "model.target_layer_ids": "[1,2]", "train.lr": 1e-2, "data.num_anchors": 16,
        "train.seed": seed, "checkpoint.every": 0, "checkpoint.save_final": "false", **extra})
    fp8 = cfg.model.target_fp8
    if fp8:  # the final drafter is measured again on the full-precision target (as served)
        cfg.checkpoint.save_final = True
    t0 = time.perf_counter()
    code = train(cfg, out=io.StringIO())
    wall = time.perf_counter() - t0
    recs = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r["accept_len"] for r in recs if r.get("phase") == "eval"}
    losses = {r["step"]: r["loss"] for r in recs if r.get("phase") == "train"}
    out = {"exit": code, "train_s": round(wall, 1), "accept_len": evals, "loss": losses}
    if fp8 and code == 0:
        out["accept_len_served"] = served_accept(cfg, steps)
    return out


def served_accept(cfg, step: int) -> float:
    """The acceptance length of the run's final drafter with the target in full precision."""
    from dfo_contract import checkpoints as manifests
    from trainer.evaluate import accept
    from trainer.core import checkpoints
    from trainer.core import step as S

    cfg.model.target_fp8 = False
    target, drafter = S.build_models(cfg, "cpu")
    st = checkpoints.read(manifests.resolve(cfg.checkpoint_dir(cfg.run.dir), f"step_{step}"),
                          device="cpu", rng=False, optim=False)
    checkpoints.apply(st, drafter=drafter, restore_rng=False)
    held = accept.HeldOut(cfg, vocab_size=target.vocab_size, mask_token_id=drafter.mask_token_id)
    return held.run(drafter, target, cfg)["accept_len"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_dflash2")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "results"))
    ap.add_argument("--variants", default=",".join(n for n, _ in VARIANTS),
                    help="comma list from " + ", ".join([n for n, _ in VARIANTS] + list(EXTRA))
                         + " (dflash-fp8: the target's layers in fp8 while training, "
                         "model.target_fp8; its final drafter is measured on both targets)")
    a = ap.parse_args(argv)
    known = dict(VARIANTS, **EXTRA)
    chosen = [n.strip() for n in a.variants.split(",") if n.strip()]
    bad = [n for n in chosen if n not in known]
    if bad or not chosen:
        ap.error(f"--variants: unknown {bad[0] if bad else a.variants!r} (known: {', '.join(known)})")
    variants = [(n, known[n]) for n in chosen]

    import torch

    torch.set_num_threads(1)
    from tests.helpers.trainer import make_target
    from trainer.data.tinylm import regenerate, teach

    res = {"steps": a.steps, "drafter_layers": a.layers, "seed": a.seed, "block_size": 8,
           "torch": torch.__version__, "dflash2_fields": DFLASH2}
    with tempfile.TemporaryDirectory(prefix="bench-dflash2-") as tmp:
        target = make_target(os.path.join(tmp, "target"))
        res["target_loss"] = round(teach(target, steps=250, seq_len=40), 4)
        train_data = regenerate(target, os.path.join(tmp, "train.jsonl"), num=128, new=36, seed=1)
        eval_data = regenerate(target, os.path.join(tmp, "eval.jsonl"), num=16, new=36, seed=2)
        for name, extra in variants:
            res[name] = train_one(target, train_data, eval_data, os.path.join(tmp, name),
                                  steps=a.steps, layers=a.layers, seed=a.seed, extra=extra)
    print(f"target taught to loss {res['target_loss']}; {a.steps} steps, block 8, "
          f"{a.layers} drafter layer(s), seed {a.seed}")
    names = [n for n, _ in variants]
    print("accept_len (and training loss) per step")
    print(f"{'step':>6} " + " ".join(f"{n:>22}" for n in names))
    for s in sorted(res[names[0]]["accept_len"]):
        cells = [f"{res[n]['accept_len'].get(s, float('nan')):>8.3f} ({res[n]['loss'].get(s, float('nan')):.4f})"
                 for n in names]
        print(f"{s:>6} " + " ".join(f"{c:>22}" for c in cells))
    print("train time: " + ", ".join(f"{n} {res[n]['train_s']} s" for n in names))
    for n in names:
        if "accept_len_served" in res[n]:
            print(f"{n}: final drafter on the full-precision target: accept_len "
                  f"{res[n]['accept_len_served']:.3f}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bench_dflash2.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0 if all(res[n]["exit"] == 0 for n in names) else 1


if __name__ == "__main__":
    sys.exit(main())
