"""Real greedy speculative decoding with a DFlash drafter: ``python -m trainer eval``.

    python -m trainer eval CHECKPOINT_OR_EXPORT --prompts FILE [--spec-decode N]
        [--target DIR] [--max-prompts K] [--device cpu|cuda] [--json OUT]

Per step: the drafter drafts B-1 tokens in ONE forward (its block ``[last token, MASK...]``
at absolute positions, conditioned on the target's tapped hidden states of every accepted
position before it); the target verifies the block in ONE forward with its KV cache; the
accepted prefix (leading drafts equal to the target's greedy choice) plus the target's own
next token are appended; the cache is cropped to the accepted length. Reported: mean
accepted length per step (= tokens per target forward), wall-clock speedup against
target-only greedy decoding (same cache, one token per forward), and whether the output
equals target-only greedy decoding token for token (lossless).

``--prompts``: JSONL with ``input_ids`` (token ids) or ``messages`` (chat; the target's
chat template with the generation prompt) or ``prompt`` (plain text) per line.
``--spec-decode N``: N new tokens per prompt (default 64). fp32 on CPU, bf16 on CUDA (in
bf16 a block verified in one forward can round differently from one token at a time, so a
rare near-tie may make the outputs differ; fp32 is the strict check).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field

import torch

from dfo_contract.exitcodes import DataError, TrainerConfigError

from ..core.methods import method_of, of_drafter


class Tapped:
    """The full target (all layers, LM head) with forward hooks on the tapped layers."""

    def __init__(self, model, tap_ids: list[int]):
        self.model, self.tap_ids = model, list(tap_ids)
        self._cap: dict[int, torch.Tensor] | None = None
        for i in self.tap_ids:
            model.model.layers[i].register_forward_hook(self._hook(i))

    def _hook(self, i):
        def hook(_m, _inp, out):
            if self._cap is not None:
                self._cap[i] = out[0] if isinstance(out, tuple) else out
        return hook

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache):
        """(logits [1, T, V], features [1, T, k*H]) for new tokens ``ids`` [1, T]."""
        self._cap = {}
        try:
            out = self.model(input_ids=ids, position_ids=positions, past_key_values=cache,
                             use_cache=True)
            feats = torch.cat([self._cap[i] for i in self.tap_ids], dim=-1)
        finally:
            self._cap = None
        return out.logits, feats


def _draft(drafter, ctx, block, pos, start: int):
    """[1, B-1]: the served draft of one block: each draft layer with the attention pattern
    the drafter declares (``drafter.spec.pattern``: what its export's ``layer_types``,
    ``sliding_window`` and ``is_causal`` make z-lab's class and the engines run); DFlash2
    walks its selector, DFlash takes the argmax."""
    from ..model import attention

    bs, dev = block.shape[1], block.device
    anchors = torch.tensor([[start]], device=dev)
    valid = torch.ones(1, 1, dtype=torch.bool, device=dev)
    masks = attention.build_masks("sdpa", anchors, valid, ctx.shape[1], bs, drafter.spec.pattern)
    hidden = drafter(ctx.to(drafter.fc.weight.dtype), block, pos,
                     attention.layer_attends("sdpa", masks))
    served = of_drafter(drafter).served_draft
    if served is not None:
        return served(drafter, hidden.view(1, 1, bs, -1), block[:, :1])[0]
    return drafter.shared.lm_head(hidden[:, 1:]).argmax(-1)                # [1, B-1]


def _crop(cache, keep: int) -> None:
    """Keep the first ``keep`` positions (a negative crop removes tokens in every version)."""
    drop = int(cache.get_seq_length()) - keep
    if drop > 0:
        cache.crop(-drop)


@dataclass
class Decoded:
    tokens: list[int]
    target_forwards: int = 0
    accept_lengths: list[int] = field(default_factory=list)
    seconds: float = 0.0


@torch.no_grad()
def greedy(target: Tapped, prompt: list[int], n_new: int, device) -> Decoded:
    """Target-only greedy decoding with a KV cache: one token per target forward."""
    from transformers import DynamicCache

    t0 = time.perf_counter()
    cache = DynamicCache()
    ids = torch.tensor([prompt], device=device)
    logits, _ = target.forward(ids, torch.arange(len(prompt), device=device).unsqueeze(0), cache)
    out = [int(logits[0, -1].argmax())]
    fwd = 0
    while len(out) < n_new:
        pos = torch.tensor([[len(prompt) + len(out) - 1]], device=device)
        logits, _ = target.forward(torch.tensor([[out[-1]]], device=device), pos, cache)
        fwd += 1
        out.append(int(logits[0, -1].argmax()))
    return Decoded(out[:n_new], target_forwards=fwd, seconds=time.perf_counter() - t0)


@torch.no_grad()
def speculative(target: Tapped, drafter, prompt: list[int], n_new: int, device) -> Decoded:
    """Greedy DFlash speculative decoding (see the module docstring)."""
    from transformers import DynamicCache

    bs, mask = int(drafter.block_size), int(drafter.mask_token_id)
    t0 = time.perf_counter()
    cache = DynamicCache()
    n = len(prompt)
    logits, ctx = target.forward(torch.tensor([prompt], device=device),
                                 torch.arange(n, device=device).unsqueeze(0), cache)
    out = [int(logits[0, -1].argmax())]
    res = Decoded([])
    while len(out) < n_new:
        start = n + len(out) - 1                      # position of the last known token
        block = torch.full((1, bs), mask, dtype=torch.long, device=device)
        block[0, 0] = out[-1]
        pos = torch.arange(start, start + bs, device=device).unsqueeze(0)
        draft = _draft(drafter, ctx, block, pos, start)
        block[0, 1:] = draft[0]
        logits, feats = target.forward(block, pos, cache)
        res.target_forwards += 1
        post = logits[0].argmax(-1)                                       # [B]
        ok = (draft[0] == post[:-1]).long()
        acc = int(torch.cumprod(ok, 0).sum())
        out.extend(int(t) for t in draft[0, :acc])
        out.append(int(post[acc]))
        res.accept_lengths.append(acc + 1)
        _crop(cache, start + acc + 1)
        ctx = torch.cat([ctx, feats[:, :acc + 1]], dim=1)
    res.tokens = out[:n_new]
    res.seconds = time.perf_counter() - t0
    return res


# --------------------------------------------------------------------------- loading

def load_pair(path: str, *, target_path: str | None, device, dtype=None):
    """(Tapped target, drafter) from a checkpoint dir (step_N) or an exported directory."""
    from ..model.hf_load import from_pretrained
    from ..model.target import tapped_layer_ids

    exported = os.path.isfile(os.path.join(path, "config.json"))
    if exported:
        with open(os.path.join(path, "config.json")) as f:
            conf = json.load(f)
        taps = conf["dflash_config"]["target_layer_ids"]
        if not target_path:
            raise TrainerConfigError("config: --target: required with an exported drafter "
                                     "(the target model directory)")
    else:
        from .export_dir import _checkpoint_config

        cfg, _ = _checkpoint_config(path)
        target_path = target_path or cfg.model.target_path
    if not target_path or not os.path.isfile(os.path.join(target_path, "config.json")):
        raise TrainerConfigError(f"config: --target: {target_path or '(none)'} has no config.json")
    if dtype is None:
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    model = from_pretrained(target_path, dtype).to(device).eval()
    if exported:
        from .export_dir import load_exported

        drafter = load_exported(path, embed_tokens=model.get_input_embeddings(),
                                lm_head=model.get_output_embeddings(), device=device)
    else:
        from ..core import checkpoints
        from ..model.drafter import DrafterSpec, SharedHead
        from ..core.step import mask_token_id
        from ..model.target import Target

        taps = tapped_layer_ids(len(model.model.layers), cfg.model.drafter_layers,
                                cfg.model.target_layer_ids)
        from dfo_contract.trainer_config.layers import layer_pattern

        spec = DrafterSpec.from_target_config(model.config, num_layers=cfg.model.drafter_layers,
                                              num_taps=len(taps), attention=layer_pattern(cfg.model))
        shared = SharedHead(model.get_input_embeddings(), model.get_output_embeddings())
        drafter = method_of(cfg).new(spec, cfg.model, shared)
        checkpoints.load(path, drafter=drafter, restore_rng=False)
        fake = Target.__new__(Target)
        fake.path, fake.config = target_path, model.config
        drafter.mask_token_id = mask_token_id(cfg, fake)
        drafter.block_size = cfg.model.block_size
        drafter.to(device)
    drafter.to(dtype).eval()
    return Tapped(model, taps), drafter


def read_prompts(path: str, target_path: str, limit: int) -> list[list[int]]:
    from ..data.tokenizer import load_tokenizer

    tok = None
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise DataError(f"data: {path}:{lineno}: not JSON ({e})") from None
            if "input_ids" in obj:
                ids = [int(i) for i in obj["input_ids"]]
                if "loss_mask" in obj and 1 in obj["loss_mask"]:   # a training sample: its prompt
                    ids = ids[: obj["loss_mask"].index(1)] or ids[:1]
            else:
                tok = tok or load_tokenizer(target_path)
                if tok is None:
                    raise DataError(f"data: {path}:{lineno}: text prompts need the target's tokenizer")
                if "messages" in obj:
                    ids = tok.apply_chat_template(obj["messages"], add_generation_prompt=True,
                                                  tokenize=True)
                    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
                elif "prompt" in obj:
                    ids = tok(obj["prompt"])["input_ids"]
                else:
                    raise DataError(f"data: {path}:{lineno}: expected input_ids, messages or prompt")
            if not ids:
                raise DataError(f"data: {path}:{lineno}: empty prompt")
            out.append(ids)
            if len(out) >= limit:
                break
    if not out:
        raise DataError(f"data: {path}: no prompts")
    return out


def evaluate(path: str, prompts_file: str, *, n_new: int = 64, target_path: str | None = None,
             device: str = "cpu", max_prompts: int = 32, dtype: str = "auto") -> dict:
    dev = torch.device(device)
    tdtype = {"auto": None, "fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    target, drafter = load_pair(path, target_path=target_path, device=dev, dtype=tdtype)
    used = drafter.fc.weight.dtype
    tpath = target_path or str(getattr(target.model.config, "_name_or_path", ""))
    prompts = read_prompts(prompts_file, tpath, max_prompts)
    greedy(target, prompts[0], 2, dev)                 # warm-up (allocator, kernels)
    speculative(target, drafter, prompts[0], 2, dev)
    rows, lossless = [], True
    t_base = t_spec = 0.0
    acc, fwd, toks = [], 0, 0
    for i, p in enumerate(prompts):
        base = greedy(target, p, n_new, dev)
        spec = speculative(target, drafter, p, n_new, dev)
        same = base.tokens == spec.tokens
        lossless &= same
        first = next((k for k, (a, b) in enumerate(zip(base.tokens, spec.tokens, strict=False)) if a != b), None)
        rows.append({"prompt": i, "lossless": same, "first_mismatch": first,
                     "mean_accept_len": sum(spec.accept_lengths) / len(spec.accept_lengths)})
        t_base, t_spec = t_base + base.seconds, t_spec + spec.seconds
        acc += spec.accept_lengths
        fwd += spec.target_forwards
        toks += len(spec.tokens) - 1                  # the prefill's token needs no verify step
    return {"kind": "spec_eval", "prompts": len(prompts), "new_tokens": n_new,
            "block_size": int(drafter.block_size),
            "mean_accept_len": sum(acc) / len(acc), "tokens_per_target_forward": toks / max(fwd, 1),
            "target_only_s": round(t_base, 4), "spec_s": round(t_spec, 4),
            "speedup": round(t_base / max(t_spec, 1e-9), 3), "lossless": lossless,
            "dtype": str(used).removeprefix("torch."), "per_prompt": rows}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer eval")
    ap.add_argument("checkpoint", help="a checkpoint dir (step_N) or an exported drafter dir")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--spec-decode", type=int, default=64, metavar="N", help="new tokens per prompt")
    ap.add_argument("--target", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-prompts", type=int, default=32)
    ap.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto",
                    help="auto: fp32 on CPU, bf16 on GPU. Token-for-token equality is checked "
                         "strictly (exit 5) in fp32; in bf16 near-ties can differ between a "
                         "verify forward and a decode forward, so a mismatch is reported only")
    ap.add_argument("--json", default=None, help="also write the report here")
    a = ap.parse_args(argv)
    rep = evaluate(a.checkpoint, a.prompts, n_new=a.spec_decode, target_path=a.target,
                   device=a.device, max_prompts=a.max_prompts, dtype=a.dtype)
    text = json.dumps(rep)
    if a.json:
        from dfo_contract.fsio import atomic_write_text

        atomic_write_text(a.json, text + "\n")
    print(f"spec-decode: {rep['prompts']} prompts x {rep['new_tokens']} tokens, B={rep['block_size']}: "
          f"mean accepted length {rep['mean_accept_len']:.3f}, "
          f"{rep['tokens_per_target_forward']:.3f} tokens/target forward, "
          f"speedup {rep['speedup']:.2f}x, lossless {rep['lossless']}")
    print("@dfo " + text)
    if not rep["lossless"] and rep["dtype"] != "float32":
        print(f"note: output differs from target-only greedy in {rep['dtype']} (near-ties); "
              "check losslessness with --dtype fp32")
        return 0
    return 0 if rep["lossless"] else 5
