"""H200: the acceptance-length path and real speculative decoding at the benchmark shape.

Random weights (no network): a Qwen3-4B-shaped target (hidden 2560, 36 layers, 32/8 heads,
head_dim 128, MLP 9728, vocab 151936), a 5-layer drafter at target width, B = 16.

1. ``accept``: the held-out acceptance-length metric (``trainer.evaluate.accept.batch_accept``) on
   one S = 3072, 512-anchor batch: target forward + drafter forward + argmax, timed.
2. ``spec``: greedy speculative decoding vs target-only greedy decoding on random prompts
   (``trainer.evaluate.spec_eval``), in fp32 (the strict lossless check) and bf16 (speed). A random
   drafter is accepted ~never, so this measures the path's overhead and losslessness, not
   a speedup.

    python3 bench/h200_spec.py --out $OUT [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build(quick: bool, dtype, device):
    from transformers import AutoModelForCausalLM, Qwen3Config

    from trainer.model.drafter import Drafter, DrafterSpec, SharedHead
    from trainer.evaluate.spec_eval import Tapped
    from trainer.model.target import tapped_layer_ids

    if quick:
        cfg = Qwen3Config(hidden_size=64, num_hidden_layers=6, vocab_size=512, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, intermediate_size=128,
                          max_position_embeddings=8192, tie_word_embeddings=True)
    else:
        cfg = Qwen3Config(hidden_size=2560, num_hidden_layers=36, vocab_size=151936,
                          num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                          intermediate_size=9728, max_position_embeddings=40960,
                          rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                          tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    taps = tapped_layer_ids(cfg.num_hidden_layers, 5 if not quick else 2)
    spec = DrafterSpec.from_target_config(cfg, num_layers=len(taps), num_taps=len(taps))
    d = Drafter(spec, SharedHead(model.get_input_embeddings(), model.get_output_embeddings()))
    d.init_weights(0)
    d.to(device=device, dtype=dtype).eval()
    d.mask_token_id, d.block_size = cfg.vocab_size - 1, 16
    return model, Tapped(model, taps), d, taps


def bench_accept(model, tapped, drafter, quick, device, dtype):
    from trainer.evaluate.accept import batch_accept
    from trainer.data.batch import Batch
    from trainer.model.blocks import sample_anchors

    s, n = (256, 32) if quick else (3072, 512)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size - 2, (1, s), generator=g)
    lm = torch.ones(1, s, dtype=torch.bool)
    lens = torch.tensor([s])
    anchors, valid = sample_anchors(lm, lens, n, 16, generator=g)
    b = Batch(input_ids=ids, loss_mask=lm, lengths=lens, anchors=anchors, anchor_valid=valid,
              num_tokens=s, num_samples=1).to(device)
    from transformers import DynamicCache

    times = []
    for _ in range(3):
        _sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            _, feats = tapped.forward(b.input_ids, torch.arange(s, device=device).unsqueeze(0),
                                      DynamicCache())
            tot, blocks = batch_accept(drafter, feats, b, block_size=16, gamma=7.0)
        _sync()
        times.append(time.perf_counter() - t0)
    return {"seq_len": s, "anchors": n, "blocks": blocks, "accept_len": tot / max(blocks, 1),
            "seconds": times, "best_s": min(times), "dtype": str(dtype)}


def bench_spec(tapped, drafter, vocab, quick, device, n_prompts=4, n_new=None):
    from trainer.evaluate.spec_eval import greedy, speculative

    n_new = n_new or (32 if quick else 128)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, vocab - 2, (128,), generator=g).tolist() for _ in range(n_prompts)]
    greedy(tapped, prompts[0], 4, device)
    speculative(tapped, drafter, prompts[0], 4, device)
    rows = []
    for p in prompts:
        _sync()
        base = greedy(tapped, p, n_new, device)
        _sync()
        spec = speculative(tapped, drafter, p, n_new, device)
        _sync()
        first = next((k for k, (a, b) in enumerate(zip(base.tokens, spec.tokens, strict=False)) if a != b), None)
        rows.append({"lossless": base.tokens == spec.tokens, "first_mismatch": first,
                     "mean_accept_len": sum(spec.accept_lengths) / len(spec.accept_lengths),
                     "target_only_s": round(base.seconds, 4), "spec_s": round(spec.seconds, 4),
                     "target_forwards": spec.target_forwards})
    return {"new_tokens": n_new, "prompts": rows, "lossless": all(r["lossless"] for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/h200_spec"))
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    import transformers

    res = {"torch": torch.__version__, "transformers": transformers.__version__,
           "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
           "quick": a.quick}
    for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        if device.type == "cpu" and dt == torch.bfloat16:
            continue
        t0 = time.perf_counter()
        model, tapped, drafter, taps = build(a.quick, dt, device)
        res[f"build_{name}_s"] = round(time.perf_counter() - t0, 2)
        res[f"accept_{name}"] = bench_accept(model, tapped, drafter, a.quick, device, dt)
        res[f"spec_{name}"] = bench_spec(tapped, drafter, model.config.vocab_size, a.quick, device)
        print(json.dumps({k: v for k, v in res.items() if k.endswith(name)}), flush=True)
        del model, tapped, drafter
        if device.type == "cuda":
            torch.cuda.empty_cache()
    with open(os.path.join(a.out, "h200_spec.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({"lossless_fp32": res["spec_fp32"]["lossless"],
                      "lossless_bf16": res.get("spec_bf16", {}).get("lossless")}))
    return 0 if res["spec_fp32"]["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
