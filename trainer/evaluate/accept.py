"""Acceptance length, measured: per block, 1 + the number of leading correct draft tokens.

``block_accept_lengths`` is SpecForge's ``compute_accept_len`` definition: a draft slot
counts when it is correct or carries no label (padding, prompt), the run of counted slots
from slot 1 is cut at the first wrong labelled one, and only labelled slots add to it;
``+1`` for the target's own token (the bonus every verification step yields). The mean
over valid blocks of held-out data is the ``accept_len`` training metric
(``eval.every`` steps, ``evaluate``), the number the best checkpoint is chosen by.
"""

from __future__ import annotations

import contextlib

import torch

from ..model import attention
from ..model.blocks import block_input_ids, block_positions
from ..core import objective
from ..core.methods import of_drafter


def block_accept_lengths(pred: torch.Tensor, labels: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """[b, N] float: 1 + leading correct draft tokens per block (slots 1..B-1 of [b, N, B])."""
    p, lab, c = pred[..., 1:], labels[..., 1:], counted[..., 1:]
    ok = (p == lab) | ~c
    run = torch.cumprod(ok.long(), dim=-1) * c.long()
    return 1.0 + run.sum(dim=-1).float()


@torch.no_grad()
def batch_accept(drafter, features: torch.Tensor, batch, *, block_size: int, gamma: float,
                 backend: str = "sdpa", chunk: int = 2048, flex=None):
    """(sum of accept lengths, number of valid blocks with a label) for one batch. ``flex``:
    trainer.model.attention's ``flex=`` for ``backend`` (``Runtime.flex``)."""
    dev = features.device
    b = batch.to(dev)
    ids = block_input_ids(b.input_ids, b.anchors, b.anchor_valid, block_size, drafter.mask_token_id)
    pos = block_positions(b.anchors, block_size)
    labels, _w, counted = objective.labels_and_weights(b.input_ids, b.loss_mask, b.anchors,
                                                       b.anchor_valid, block_size, gamma)
    masks = attention.build_masks(backend, b.anchors, b.anchor_valid, b.input_ids.shape[1],
                                  block_size, drafter.spec.pattern)
    attends = attention.layer_attends(backend, masks, flex=flex)
    hidden = drafter(features, ids, pos, attends)  # [b, N*B, H]
    served = of_drafter(drafter).served_draft
    if served is not None:    # the method's own served draft (DFlash2: the selector's path)
        path = served(drafter, hidden.view(*labels.shape, -1), labels[..., 0])
        pred = torch.cat([labels[..., :1], path], dim=-1)
        lens = block_accept_lengths(pred, labels, counted)
        blocks = b.anchor_valid & counted[..., 1:].any(-1)
        return float(lens[blocks].sum()), int(blocks.sum())
    w = drafter.shared.lm_head.weight
    flat = hidden.reshape(-1, hidden.shape[-1])
    pred = torch.empty(flat.shape[0], dtype=torch.long, device=dev)
    for s in range(0, flat.shape[0], chunk):
        pred[s:s + chunk] = (flat[s:s + chunk].to(w.dtype) @ w.t()).float().argmax(-1)
    pred = pred.view_as(labels)
    lens = block_accept_lengths(pred, labels, counted)
    blocks = b.anchor_valid & counted[..., 1:].any(-1)
    return float(lens[blocks].sum()), int(blocks.sum())


def evaluate(drafter, target, batches, *, block_size: int, gamma: float, features_fn,
             backend: str = "sdpa", flex=None) -> dict:
    """Mean acceptance length over ``batches`` (held-out data): ``{"accept_len", "blocks"}``."""
    was = drafter.training
    drafter.eval()
    total, n = 0.0, 0
    try:
        for batch in batches:
            feats = features_fn(batch)
            s, k = batch_accept(drafter, feats, batch, block_size=block_size, gamma=gamma,
                                backend=backend, flex=flex)
            total, n = total + s, n + k
    finally:
        drafter.train(was)
    return {"accept_len": (total / n) if n else None, "blocks": n}


# --------------------------------------------------------------------------- held-out eval

class HeldOut:
    """The first ``eval.max_samples`` samples of ``data.eval_path``, as fixed batches (same
    anchors every evaluation: a pure function of the seed), scored by ``evaluate``."""

    def __init__(self, cfg, *, vocab_size: int, mask_token_id: int | None, tokenizers=None):
        """``tokenizers``: the process's (trainer.data.tokenizer.Tokenizers; None: loaded now)."""
        from ..data.collate import collate
        from ..data.datasets import JsonlDataset
        from ..data.tokenizer import tokenizer_loader

        d = cfg.data
        tok = tokenizer_loader(tokenizers)(cfg.model.target_path) if d.format in ("auto", "chat") else None
        self.ds = JsonlDataset(d.eval_path, vocab_size=vocab_size, block_size=cfg.model.block_size,
                               max_seq_len=d.max_seq_len, min_loss_tokens=cfg.min_loss_tokens(),
                               fmt=d.format, tokenizer=tok, mask_token_id=mask_token_id)
        n = min(len(self.ds), cfg.eval.max_samples)
        mb = cfg.train.micro_batch
        na = cfg.eval.num_anchors or d.num_anchors
        self.batches = []
        for i, s in enumerate(range(0, n, mb)):
            samples = [self.ds.get(j) for j in range(s, min(n, s + mb))]
            self.batches.append(collate(samples, block_size=cfg.model.block_size, num_anchors=na,
                                        seq_buckets=cfg.eval_seq_buckets(), anchor_buckets=[na],
                                        seed=cfg.train.seed + 7777, micro_index=i))
        self.ds.close()

    def run(self, drafter, target, cfg) -> dict:
        from ..core import step as S

        dev = next(iter(drafter.trainable_parameters())).device

        def feats(batch):
            return S.target_features(target, batch, cfg).to(dev)

        # the target's compiled layers (compile.target) were warmed for the training shapes
        # only; a held-out batch may be shorter (its last), so they run eagerly here. With
        # model.target_fp8 and eval.target served, on the full-precision weights
        fp8 = cfg.model.target_fp8 and cfg.eval.target == "served"
        with S.autocast(cfg, dev), target.eager(), \
                (target.served() if fp8 else contextlib.nullcontext(None)) as ran:
            ev = evaluate(drafter, target, self.batches, block_size=cfg.model.block_size,
                          gamma=cfg.gamma(), features_fn=feats)
        ev["target"] = ran or ("fp8" if cfg.model.target_fp8 else None)
        return ev


def write_best(ckdir: str, step: int, accept_len: float) -> str:
    """``<ckdir>/best``: ``{"step", "name", "accept_len"}``, written atomically."""
    import os

    from dfo_contract.fsio import atomic_write_json

    path = os.path.join(ckdir, "best")
    os.makedirs(ckdir, exist_ok=True)
    atomic_write_json(path, {"step": int(step), "name": f"step_{int(step)}",
                             "accept_len": float(accept_len)})
    return path


def read_best(ckdir: str) -> dict | None:
    import json
    import os

    path = os.path.join(ckdir, "best")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)
