"""The frozen target: a transformers causal-LM directory, run up to the last tapped layer.

``load_target(path, ...)`` loads the model from disk only (never a hub), freezes it, and
captures each tapped layer's output with forward hooks (so no final norm sneaks into the
last tapped state). It reads the config first and builds the model with only the decoder
layers up to the last tapped one, so the later layers' weights are never read nor
allocated; the weights go straight to the device when transformers can place them there
(``device_map``, which needs ``accelerate``), else through the CPU. The embedding, the final
norm and the LM head are kept (the drafter shares the embedding and the LM head).

``python -m trainer.model.target --out DIR`` writes a tiny random-init Qwen3 target
(hidden 64, vocab 128, 4 layers by default) with ``save_pretrained`` plus a tiny
character-level tokenizer with a chat template and a ``<|mask|>`` token (id 3), so chat
data and the demo work with no download.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
from typing import Iterator

import torch
from torch import nn

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.fsio import fsync_dir, replace_dir, tmp_name

from .hf_load import from_pretrained, quiet_transformers, restored, shortened

TINY_SPECIALS = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
TINY_MASK_ID = 3
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tapped_layer_ids(num_target_layers: int, num_drafter_layers: int,
                     explicit: list[int] | None = None) -> list[int]:
    """The target layers whose outputs feed the drafter.

    Default: ``round(1 + i*(T-4)/(L-1))`` for i < L when L > 1, ``[T//2]`` when L == 1.
    Duplicates, negatives and ids >= T are rejected (e.g. the formula on a 2-layer target),
    and so is the last layer T-1: serving engines (z-lab's loop, vLLM, SGLang) take its
    hidden state after the target's final norm, which training never sees.
    """
    t, n = num_target_layers, num_drafter_layers
    flag = "--model.target_layer_ids"
    if explicit is not None:
        ids = [int(i) for i in explicit]
        src = f"{flag} {ids}"
    elif n == 1:
        ids, src = [t // 2], f"the default for 1 drafter layer on a {t}-layer target"
    else:
        ids = [int(round(1 + i * (t - 4) / (n - 1))) for i in range(n)]
        src = f"the default round(1+i*(T-4)/(L-1)) for L={n} drafter layers on a {t}-layer target"
    problem = None
    if not ids:
        problem = "no layer ids"
    elif len(set(ids)) != len(ids):
        problem = f"duplicate layer ids {ids}"
    elif min(ids) < 0:
        problem = f"negative layer id in {ids}"
    elif max(ids) >= t:
        problem = f"layer id {max(ids)} out of range for a {t}-layer target (ids must be < {t})"
    if problem:
        raise TrainerConfigError(f"config: {flag}: {problem} from {src}; give valid distinct ids "
                                 f"in [0, {t}) with {flag}, or change --model.drafter_layers")
    if max(ids) == t - 1:
        # serving engines read the last layer's state after the target's final norm; training
        # would see it before: the drafts would diverge from what was trained
        raise TrainerConfigError(
            f"config: {flag}: layer {t - 1} is the last layer of the {t}-layer target (servers "
            f"feed its final-normed state), from {src}; tap layers 0..{t - 2} with {flag}")
    return ids


class Target:
    """A frozen HF causal LM truncated after its last tapped layer."""

    def __init__(self, model: nn.Module, tap_ids: list[int], path: str = "",
                 num_layers_total: int | None = None):
        """``num_layers_total``: the target's full layer count, when ``model`` was built with
        fewer layers (default: the layers ``model`` has)."""
        self.model = model
        self.config = model.config
        self.tap_ids = list(tap_ids)
        self.path = path
        self.num_layers_total = int(num_layers_total or len(self._layers()))
        last = max(self.tap_ids)
        layers = self._layers()
        self.model.model.layers = nn.ModuleList(list(layers)[: last + 1])
        self._local = threading.local()  # captured states per calling thread (threads layout)
        self.compiled_layers = ""  # the registry name once compiled (trainer.compile.target)
        self.fp8_linears = 0       # to_fp8: the decoder-layer linears holding fp8 weights
        for i in self.tap_ids:
            self.model.model.layers[i].register_forward_hook(self._hook(i))
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.model.eval()

    def _layers(self):
        return self.model.model.layers

    def _hook(self, i: int):
        def hook(_mod, _inp, out):
            cap = getattr(self._local, "captured", None)
            if cap is not None:
                cap[i] = out[0] if isinstance(out, tuple) else out
        return hook

    @property
    def embed_tokens(self) -> nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def layers_run(self) -> int:
        return max(self.tap_ids) + 1

    def to_fp8(self, keep_full: bool = False) -> int:
        """The kept decoder layers' linears with fp8 weights and rowwise scales
        (``trainer.model.fp8``); before compiling the layers and the first forward. Idempotent;
        returns how many linears hold fp8 weights. ``keep_full``: keep the full-precision
        weights in host memory, for ``served()``."""
        if not self.fp8_linears:
            from .fp8 import convert_linears

            self.fp8_linears = sum(convert_linears(layer, keep_full)
                                   for layer in self.model.model.layers)
        return self.fp8_linears

    @contextlib.contextmanager
    def served(self) -> Iterator[str]:
        """Run the target as the engines serve it for the duration: fp8 layers holding their
        full-precision weights compute with those. Yields what runs: ``served`` (full
        precision) or ``fp8`` (no full-precision copy was kept). Use it with ``eager()``:
        compiled layers were traced with the fp8 product."""
        from .fp8 import Fp8Linear

        lins = [m for layer in self.model.model.layers for m in layer.modules()
                if isinstance(m, Fp8Linear)]
        if any(m.full is None for m in lins):
            yield "fp8"
            return
        for m in lins:
            m.served = True
        try:
            yield "served"
        finally:
            for m in lins:
                m.served = False

    @property
    def layers(self) -> list[nn.Module]:
        """The kept decoder layers (``trainer.compile.target.compile_layers`` wraps their
        ``forward`` from outside)."""
        return list(self.model.model.layers)

    @contextlib.contextmanager
    def eager(self) -> Iterator[None]:
        """Run the decoder layers eagerly in this thread for the duration (no-op uncompiled)."""
        before = self.runs_eager()
        self._local.eager = True
        try:
            yield
        finally:
            self._local.eager = before

    def runs_eager(self) -> bool:
        """Whether this thread is inside ``with target.eager():`` (compiled layers honour it)."""
        return getattr(self._local, "eager", False)

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor,
                 position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[b, S, k*H]: the outputs of the tapped layers (hidden_states[id+1]), concatenated.

        ``position_ids`` [b, S] (packed rows): positions that restart at each sample's first
        token; each sample then attends causally inside itself (``packed_causal_mask``)."""
        cap: dict[int, torch.Tensor] = {}
        self._local.captured = cap
        mask = None if position_ids is None else packed_causal_mask(position_ids)
        try:
            self.model.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                             use_cache=False)
            return torch.cat([cap[i] for i in self.tap_ids], dim=-1)
        finally:
            self._local.captured = None


def packed_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """Bool [b, 1, S, S]: query i sees key j when both lie in one sample (a sample starts
    where its position is 0) and j <= i. transformers takes a 4D mask as it is, so every
    packed micro-batch gives the decoder layers the same kind of input, whether a row holds
    one sample or many (its own packed-sequence detection leaves the mask out when no row
    has a second sample, which would be another compiled graph)."""
    doc = (position_ids == 0).cumsum(-1)
    s = position_ids.shape[-1]
    idx = torch.arange(s, device=position_ids.device)
    causal = idx.view(1, -1) <= idx.view(-1, 1)
    return ((doc.unsqueeze(-1) == doc.unsqueeze(-2)) & causal).unsqueeze(1)


def load_target(path: str, *, device, dtype: torch.dtype, num_drafter_layers: int,
                tap_ids: list[int] | None = None) -> Target:
    """The frozen target, built with the decoder layers up to the last tapped one only.

    ``num_layers_total`` and ``config.num_hidden_layers`` stay the full count (taps are
    checked against it); the model holds ``max(taps)+1`` layers, loaded on ``device``."""
    if not path:
        raise TrainerConfigError("config: --model.target_path: required: a transformers "
                                 "causal-LM directory (python -m trainer.model.target --out DIR makes a tiny one)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise TrainerConfigError(f"config: --model.target_path: {path} has no config.json "
                                 "(give a local transformers model directory; nothing is downloaded)")
    config = _read_config(path)
    n_layers = getattr(config, "num_hidden_layers", None)
    if isinstance(n_layers, int):
        ids = tapped_layer_ids(n_layers, num_drafter_layers, tap_ids)
        old = shortened(config, max(ids) + 1)
        model = from_pretrained(path, dtype, config=config, device=device)
        restored(model.config, old)  # the model's config names the whole target, as before
    else:  # a config transformers cannot read or without a layer count: load whole, cut after
        model = from_pretrained(path, dtype)
        n_layers = len(model.model.layers)
        ids = tapped_layer_ids(n_layers, num_drafter_layers, tap_ids)
    t = Target(model, ids, path, num_layers_total=n_layers)
    t.model.to(device)
    return t


def _read_config(path: str):
    """The directory's transformers config, or None when transformers cannot read it (the
    full load then reports why)."""
    from transformers import AutoConfig

    quiet_transformers()
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, OSError, KeyError):
        return None


def target_from_config(tcfg, *, device, dtype: torch.dtype, num_drafter_layers: int,
                       tap_ids: list[int] | None = None, seed: int = 0) -> Target:
    """A random-init target built from a config in memory (the benchmark uses this)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(tcfg)
    model.to(dtype)
    ids = tapped_layer_ids(tcfg.num_hidden_layers, num_drafter_layers, tap_ids)
    return Target(model, ids, "<random>")


# --------------------------------------------------------------------------- tiny target

def tiny_qwen3_config(*, hidden=64, layers=4, vocab=128, heads=4, kv_heads=2, head_dim=16,
                      intermediate=128, max_pos=4096, init_range=0.2):
    """A tiny Qwen3 config. ``init_range`` 0.2 (not 0.02) gives the random LM head logits of
    a useful scale, so a drafter's loss visibly falls within a few dozen CPU steps."""
    from transformers import Qwen3Config

    return Qwen3Config(hidden_size=hidden, num_hidden_layers=layers, vocab_size=vocab,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                       intermediate_size=intermediate, max_position_embeddings=max_pos,
                      initializer_range=init_range,
                       tie_word_embeddings=False, pad_token_id=0, bos_token_id=None,
                       eos_token_id=2)


def write_tiny_tokenizer(out: str, vocab: int) -> None:
    """A character-level tokenizer: ids 0-3 special, then printable ASCII, then filler."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    table = {t: i for i, t in enumerate(TINY_SPECIALS)}
    for ch in chars:
        if len(table) >= vocab:
            break
        table.setdefault(ch, len(table))
    while len(table) < vocab:
        table[f"<|unused{len(table)}|>"] = len(table)
    tok = Tokenizer(models.BPE(vocab=table, merges=[], unk_token="?" if "?" in table else None))
    tok.add_special_tokens(TINY_SPECIALS)
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|im_end|>",
                                   mask_token="<|mask|>", unk_token="?")
    fast.chat_template = TINY_CHAT_TEMPLATE
    fast.save_pretrained(out)


def make_tiny_target(out: str, *, hidden=64, layers=4, vocab=128, heads=4, kv_heads=2,
                     head_dim=16, intermediate=128, seed=0, tokenizer=True) -> str:
    """Write a random-init Qwen3 (and a tiny tokenizer) to ``out`` via a temp dir + rename."""
    from transformers import Qwen3ForCausalLM

    quiet_transformers()
    if vocab < 100 and tokenizer:
        raise TrainerConfigError("target: --vocab must be >= 100 to hold the tiny tokenizer "
                                 "(or pass --no-tokenizer)")
    parent = os.path.dirname(os.path.abspath(out)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tmp_name(os.path.join(parent, os.path.basename(out)))
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_qwen3_config(hidden=hidden, layers=layers, vocab=vocab, heads=heads,
                                               kv_heads=kv_heads, head_dim=head_dim,
                                               intermediate=intermediate))
    model.save_pretrained(tmp)
    if tokenizer:
        write_tiny_tokenizer(tmp, vocab)
    with open(os.path.join(tmp, "dfo_target.json"), "w") as f:
        json.dump({"kind": "tiny-random-qwen3", "seed": seed,
                   "mask_token_id": TINY_MASK_ID if tokenizer else None}, f)
    fsync_dir(tmp)
    replace_dir(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.model.target",
                                 description="Write a tiny random-init Qwen3 target directory.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-tokenizer", action="store_true")
    a = ap.parse_args(argv)
    try:
        make_tiny_target(a.out, hidden=a.hidden, layers=a.layers, vocab=a.vocab, heads=a.heads,
                         kv_heads=a.kv_heads, head_dim=a.head_dim, intermediate=a.intermediate,
                         seed=a.seed, tokenizer=not a.no_tokenizer)
    except TrainerConfigError as e:
        print(f"trainer.model.target: {e}", file=sys.stderr)
        return 2
    print(f"wrote tiny Qwen3 target to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
