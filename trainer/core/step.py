"""One drafter training step's building blocks: the stable interface layouts build on.

Layouts (single here; threads/ddp in trainer/parallel/) and the compile gate's warm-up use
exactly these functions:

    build_models(cfg, device, rt=rt) -> (Target, Drafter)
    target_features(target, batch, cfg) -> Tensor            # no_grad, [b, S, k*H]
    drafter_loss(drafter, features, batch, cfg, rt=rt) -> (loss, metrics)
    dummy_batch(cfg, seq_len, num_anchors, batch_size, device) -> Batch
    shape_buckets(cfg) -> [(seq_len, num_anchors), ...]

Every batch (``trainer.data.batch.Batch``) is padded into one of ``shape_buckets(cfg)`` by
``trainer.data.collate``, so the set of shapes compiled code sees is finite and known before
training starts. Imports go one way: step -> data (tokenizer), data -> batch, never back.

``rt`` is the process's ``trainer.core.runtime.Runtime``: what compiles (the drafter step with
``compile.enabled``, the target's layers with ``compile.target``, flex attention) goes through
its compile registry. Without one (None) a step compiles nothing: a config that needs a
compile says so with a ValueError.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch

from dfo_contract.exitcodes import TrainerConfigError
from dfo_contract.trainer_config import TrainerConfig
from dfo_contract.trainer_config.layers import layer_pattern

from ..compile.registry import variant
from ..data.batch import Batch
from ..model import attention, blocks
from ..model.drafter import Drafter, DrafterSpec, SharedHead, build_drafter
from ..model.target import Target, load_target
from . import objective
from .methods import method_of
from .runtime import Runtime

log = logging.getLogger("dfo")


# --------------------------------------------------------------------------- devices, dtypes

def resolve_device(spec: str | torch.device) -> torch.device:
    if isinstance(spec, torch.device):
        return spec
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise TrainerConfigError(f"config: --parallel.drafter_devices: {spec} requested but CUDA is "
                                 "not available here; use cpu")
    return torch.device(spec)


def compute_dtype(cfg: TrainerConfig, device: torch.device) -> torch.dtype:
    """bf16 on GPU, fp32 on CPU, unless ``model.dtype`` says otherwise."""
    d = cfg.model.dtype
    if d == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[d]


def resolve_backend(cfg: TrainerConfig, device: torch.device) -> str:
    """``auto`` -> flex on CUDA, sdpa on CPU. flex/flex-eager on CPU are refused for training:
    flex_attention has no backward on CPU (torch 2.13), compiled or not."""
    a = cfg.model.attention
    if a == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    if a in ("flex", "flex-eager") and device.type == "cpu":
        raise TrainerConfigError(f"config: --model.attention: {a} has no backward on CPU in this "
                                 "torch; use sdpa on CPU")
    return a


def autocast(cfg: TrainerConfig, device: torch.device):
    dt = compute_dtype(cfg, device)
    return torch.autocast(device_type=device.type, dtype=dt, enabled=dt != torch.float32)


# --------------------------------------------------------------------------- models

def build_models(cfg: TrainerConfig, device, *, target_device=None,
                 target: Target | None = None, rt: Runtime | None = None) -> tuple[Target, Drafter]:
    """Load the frozen target and build the drafter (sharing its embedding and LM head).

    ``device``: the drafter's device; ``target_device`` defaults to it. When they differ,
    the drafter gets its own frozen copy of the embedding/LM head on its device. Pass
    ``target`` to reuse an already loaded one (threads layout: one target, many drafters).
    The drafter's resolved attention backend is ``drafter.attn_backend``.
    """
    device = resolve_device(device)
    tdev = resolve_device(target_device) if target_device is not None else device
    if target is None:
        target = load_target(cfg.model.target_path, device=tdev, dtype=compute_dtype(cfg, tdev),
                             num_drafter_layers=cfg.model.drafter_layers,
                             tap_ids=cfg.model.target_layer_ids)
    prepare_target(cfg, target, rt)
    mask_id = mask_token_id(cfg, target, rt.tokenizers if rt is not None else None)
    embed, head = target.embed_tokens, target.lm_head
    if target.device != device:
        embed, head = copy.deepcopy(embed).to(device), copy.deepcopy(head).to(device)
    spec = DrafterSpec.from_target_config(target.config, num_layers=cfg.model.drafter_layers,
                                          num_taps=len(target.tap_ids),
                                          attention=layer_pattern(cfg.model))
    m = method_of(cfg)

    def make():
        return m.new(spec, cfg.model, SharedHead(embed, head))
    seed = cfg.model.init_seed if cfg.model.init_seed is not None else cfg.train.seed
    drafter = build_drafter(make, device=device, seed=seed)
    if cfg.model.init_from:
        from .init_from import load_into

        load_into(cfg, target, drafter)
    m.prepare(drafter, cfg.train)
    drafter.to(device)
    drafter.attn_backend = resolve_backend(cfg, device)
    drafter.mask_token_id = mask_id
    return target, drafter


def prepare_target(cfg: TrainerConfig, target: Target, rt: Runtime | None = None) -> None:
    """The target's run settings, before its first forward. Idempotent.

    ``model.target_fp8``: its decoder layers' linears hold fp8 weights (``Target.to_fp8``).
    ``compile.target`` (independent of ``compile.enabled``, the drafter step's switch):
    compile the target's decoder layers (``trainer.compile.target.compile_layers``, default mode: the
    drafter's ``compile.mode`` is not applied to the target). The layers compile on their
    first forward, which the layouts run in the gate's warm-up; with
    ``compile.target_dynamic`` one graph serves every sequence bucket."""
    if cfg.model.target_fp8:
        dev = target.device
        if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < (8, 9):
            raise TrainerConfigError(
                f"config: --model.target_fp8: {torch.cuda.get_device_name(dev)} has no FP8 matrix "
                "units (compute capability 8.9 or newer: Ada, Hopper, Blackwell); set it to false")
        target.to_fp8(keep_full=bool(cfg.eval.every) and cfg.eval.target == "served")
    if cfg.compile.target:
        from ..compile.target import compile_layers

        compile_layers(_registry(rt, "compile.target"), target, dynamic=cfg.compile.target_dynamic)


def _registry(rt: Runtime | None, what: str):
    """``rt``'s compile registry; ``what`` needs one (a ValueError without a runtime)."""
    if rt is None:
        raise ValueError(f"{what} compiles: pass the process's Runtime (rt=)")
    return rt.compile


def _flex(rt: Runtime | None, backend: str):
    """The ``flex=`` of trainer.model.attention for ``backend`` (``Runtime.flex``)."""
    if rt is None:
        if backend == "flex":
            _registry(rt, "model.attention=flex")
        return None
    return rt.flex(backend)


def uses_compiled(cfg: TrainerConfig, drafters) -> bool:
    """Whether a layout runs anything compiled: the drafter step (``compile.enabled``), the
    target's layers (``compile.target``) or flex attention in any of ``drafters``."""
    return bool(cfg.compile.enabled or cfg.compile.target
                or any(d.attn_backend == "flex" for d in drafters))


def warmup_what(cfg: TrainerConfig, what: str) -> str:
    """A warm-up unit's name, naming the target's layers when they are compiled too."""
    return f"{what} + target layers" if cfg.compile.target else what


def mask_token_id(cfg: TrainerConfig, target: Target, tokenizers=None) -> int:
    """``model.mask_token_id``, else the target tokenizer's mask token; must be < vocab.
    ``tokenizers``: the process's (trainer.data.tokenizer.Tokenizers; None: loaded now)."""
    mid = cfg.model.mask_token_id
    if mid is None:
        mid = tokenizer_mask_id(target.path, tokenizers)
    if mid is None:
        from ..model.family import family_mask_token_id

        tok_len = _tokenizer_len(target.path, tokenizers)
        fam = family_mask_token_id(target.path, target.vocab_size, tok_len)
        if fam is not None:
            mid, note = fam
            log.warning(note)
    if mid is None:
        raise TrainerConfigError("config: --model.mask_token_id: required: an unused token id of the "
                                 "target's vocabulary (the target's tokenizer defines no mask token)")
    if not 0 <= mid < target.vocab_size:
        raise TrainerConfigError(f"config: --model.mask_token_id: {mid} is outside the target's "
                                 f"vocabulary [0, {target.vocab_size})")
    return int(mid)


def _tokenizer_len(path: str, tokenizers) -> int | None:
    import os

    if not path or not os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        return None
    from ..data.tokenizer import tokenizer_loader

    tok = tokenizer_loader(tokenizers)(path)
    return len(tok) if tok is not None else None


def tokenizer_mask_id(path: str, tokenizers=None) -> int | None:
    """The mask token id a target directory names (``dfo_target.json``, else its tokenizer's);
    None when it names none. ``tokenizers``: as for ``mask_token_id``."""
    import json
    import os

    if not path:
        return None
    hint = os.path.join(path, "dfo_target.json")
    if os.path.isfile(hint):
        with open(hint) as f:
            v = json.load(f).get("mask_token_id")
        if v is not None:
            return int(v)
    cfg_path = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(cfg_path):
        from ..data.tokenizer import tokenizer_loader

        tok = tokenizer_loader(tokenizers)(path)
        if tok is not None and tok.mask_token_id is not None:
            return int(tok.mask_token_id)
    return None


# --------------------------------------------------------------------------- the step

def target_features(target: Target, batch: Batch, cfg: TrainerConfig) -> torch.Tensor:
    """[b, S, k*H]: the tapped target states (no_grad), before the drafter's fc."""
    pos = batch.position_ids
    with torch.no_grad(), autocast(cfg, target.device):
        return target.features(batch.input_ids.to(target.device),
                               None if pos is None else pos.to(target.device))


def drafter_loss(drafter: Drafter, features: torch.Tensor, batch: Batch, cfg: TrainerConfig,
                 rt: Runtime | None = None):
    """Loss and metric tensors (``loss``, ``correct_per_pos``, ``count_per_pos``, ``weight_sum``).

    No ``.item()``: nothing here synchronizes with the device. With ``compile.enabled`` the
    drafter forward + chunked CE run as one compiled function (through the compile guard);
    the block mask is always built outside compiled code.
    """
    dev = features.device
    b = batch.to(dev, non_blocking=True)
    bs = cfg.model.block_size
    s_len = b.input_ids.shape[1]
    backend = getattr(drafter, "attn_backend", "sdpa")
    ids = blocks.block_input_ids(b.input_ids, b.anchors, b.anchor_valid, bs, drafter.mask_token_id)
    pos = blocks.block_positions(b.anchors, bs, b.position_ids)
    labels, weights, counted = objective.labels_and_weights(b.input_ids, b.loss_mask, b.anchors,
                                                            b.anchor_valid, bs, cfg.gamma(),
                                                            b.doc_hi)
    masks = attention.build_masks(backend, b.anchors, b.anchor_valid, s_len, bs,
                                  drafter.spec.pattern, b.doc_lo)
    # compiled, flex_attention is inductor's inside the step: no callable crosses into it
    flex = None if cfg.compile.enabled and backend == "flex" else _flex(rt, backend)
    m = method_of(cfg)
    args: tuple[Any, ...] = (drafter, features, ids, pos, b.position_ids, masks, labels, weights,
                             counted, backend, flex, cfg.model.ce_chunk, *m.step_args(cfg))
    step_fn, base = m.forward_loss, m.step_name
    with autocast(cfg, dev):
        if cfg.compile.enabled:
            registry = _registry(rt, "compile.enabled")
            name, opts = variant(base, cfg.compile.mode)
            fn = registry.compiled(name, step_fn, **opts)
            with registry.guard(name):
                return fn(*args)
        return step_fn(*args)


def shape_buckets(cfg: TrainerConfig) -> list[tuple[int, int]]:
    """Every (seq_len, num_anchors) a batch can be padded to: the compiled-shape set."""
    return [(s, n) for s in cfg.seq_buckets() for n in cfg.anchor_buckets()]


def compile_variants(cfg: TrainerConfig, drafter_devices: int, target_devices: int) -> int:
    """How many variants of one compiled function a warm-up compiles (the gate's recompile
    limit): the drafter step per shape bucket and drafter device; with ``compile.target`` the
    target's layer function per sequence bucket and target device (all layers share it)."""
    n = len(shape_buckets(cfg)) * drafter_devices
    if cfg.compile.target:
        n = max(n, len(cfg.seq_buckets()) * target_devices)
    return n


def dummy_batch(cfg: TrainerConfig, seq_len: int, num_anchors: int, batch_size: int, device,
                *, seed: int = 0) -> Batch:
    """A full batch of one shape bucket (random tokens, all anchors valid where possible);
    with ``data.pack``, rows of two packed samples each (the packed batch's fields, as the
    training stream's)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    bs = cfg.model.block_size
    if cfg.data.pack:
        from ..data.formats import Sample
        from ..data.pack import RowShape, pack_rows

        half = seq_len // 2
        rows = [[Sample(torch.randint(4, 100, (n,), generator=g).tolist(), [1] * n)
                 for n in (half, seq_len - half)] for _ in range(batch_size)]
        return pack_rows(rows, shape=RowShape(seq_len, num_anchors), block_size=bs,
                         num_anchors=max(1, num_anchors // 2), seed=seed,
                         micro_index=0).to(device)
    ids = torch.randint(4, 100, (batch_size, seq_len), generator=g)
    lm = torch.ones(batch_size, seq_len, dtype=torch.bool)
    lens = torch.full((batch_size,), seq_len, dtype=torch.long)
    anchors, valid = blocks.sample_anchors(lm, lens, num_anchors, bs, generator=g)
    return Batch(input_ids=ids, loss_mask=lm, lengths=lens, anchors=anchors, anchor_valid=valid,
                 num_tokens=batch_size * seq_len, num_samples=batch_size).to(device)
