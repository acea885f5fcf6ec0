"""The DFlash2 training objective: the DFlash loss on the served unary logits + the selector loss.

Labels, weights and the anchor geometry are ``trainer.core.objective``'s (slot k predicts
``x[anchor+k]``, weight ``exp(-(k-1)/gamma) * loss_mask``, slot 0 unweighted).

- **Unary loss.** ``sum(w * CE(u)) / sum(w)`` with ``u = cap * tanh(lm_head(h) * m / cap)``
  (``model.final_logit_softcapping``, ``model.output_multiplier``): the logits the selector
  ranks at serving time. Chunked over rows; full-vocabulary logits are never all alive.
- **Selector loss** (as SpecForge's DFlash2 objective, ``docs/concepts/DFlash2.md`` at
  0d220b5 and ``training/strategies/base.py`` at 6a9331f). Per slot, the
  top-``model.selector_top_k`` candidates of ``u``; a slot whose gold token is not among
  them has no selector term (``train.selector_gold_insert``: it replaces the weakest
  candidate instead, so every slot has a K-way label). Teacher-forced: slot k's predecessor
  is the gold token of slot k-1 (the anchor token for slot 1). ``CE(unary(c) +
  transition(pred, c))`` over the K candidates, weighted with the unary loss's weights and
  normalized by the same sum; gradients reach the backbone through both terms unless
  ``train.selector_stop_gradient`` detaches the hidden states (and with them the unary
  scores) inside the selector term.
- **Loss** = unary + alpha * selector, alpha the drafter's ``selector_alpha`` (a 0-d
  tensor the loop sets each step from ``selector_alpha_at``: 0 during
  ``train.selector_warmup_ratio`` of the steps, then rising linearly over
  ``train.selector_ramp_ratio`` of them to ``train.selector_loss_alpha``). An alpha of 0
  freezes the selector: its parameters leave the optimizer and no selector term is built.
- **Metrics.** ``correct_per_pos`` counts the selector's teacher-forced pick (what a
  served block proposes while it is still right); a gold token outside the real top-k
  is never counted correct.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model import attention
from .objective import ChunkedHeadCE, step_metrics


def training_candidates(top: torch.Tensor, gold: torch.Tensor):
    """(candidate ids, gold's index, gold in the real top-k): the gold token replaces the last
    candidate where the top-k misses it. top [..., K], gold [...]."""
    hit = top.eq(gold.unsqueeze(-1))
    contains = hit.any(-1)
    k = top.shape[-1]
    where = torch.where(contains, hit.long().argmax(-1), torch.full_like(gold, k - 1))
    cand = top.clone()
    cand[..., -1] = torch.where(contains, top[..., -1], gold)
    return cand, where, contains


def selector_scores(drafter, h: torch.Tensor, pred: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """[T, K] fp32: unary(c) + transition(pred, c) for candidates ``cand`` [T, K] of rows h [T, H]."""
    w = drafter.shared.lm_head.weight
    z = torch.einsum("th,tkh->tk", h.to(w.dtype), w[cand])
    trans = drafter.candidate_selector.transition(h, pred, cand)
    return drafter.unary_logits(z) + trans.float()


def selector_alpha_at(train_cfg, step: int, horizon: int) -> float:
    """The selector loss weight at optimizer step ``step`` (0-based) of ``horizon`` steps."""
    target = float(train_cfg.selector_loss_alpha)
    if target <= 0 or horizon <= 0:
        return target
    warmup = int(horizon * train_cfg.selector_warmup_ratio)
    if step < warmup:
        return 0.0
    ramp = int(horizon * train_cfg.selector_ramp_ratio)
    if ramp <= 0:
        return target
    return target * min(max((step - warmup + 1) / ramp, 0.0), 1.0)


def selector_labels(top: torch.Tensor, gold: torch.Tensor, gold_insert: bool):
    """(candidates [T, K], gold's index [T], gold in the real top-k [T], rows with a term)."""
    if gold_insert:
        cand, where, contains = training_candidates(top, gold)
        return cand, where, contains, torch.ones_like(contains)
    hit = top.eq(gold.unsqueeze(-1))
    contains = hit.any(-1)
    return top, hit.long().argmax(-1), contains, contains


def dflash2_loss(drafter, hidden: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                 counted: torch.Tensor, *, alpha, chunk: int = 2048, gold_insert: bool = False,
                 stop_gradient: bool = False):
    """(loss, metrics) with the metric keys of ``objective.weighted_ce``; no ``.item()``.

    hidden [b, N*B, H]; labels/weights/counted [b, N, B]; ``alpha``: the selector term's
    weight (a float or 0-d tensor), None for no selector term (a frozen selector)."""
    b, n, bs = labels.shape
    d2 = drafter.d2
    h = hidden.view(b, n, bs, -1)[:, :, 1:, :].reshape(-1, hidden.shape[-1])
    gold = labels[:, :, 1:].reshape(-1)
    pred = labels[:, :, :-1].reshape(-1)           # slot k's predecessor: the gold of slot k-1
    w = weights[:, :, 1:].reshape(-1)
    cnt = counted[:, :, 1:]
    denom = w.sum()
    wn = w / denom.clamp(min=1e-12)
    unary, _, top = ChunkedHeadCE.apply(h, drafter.shared.lm_head.weight, gold, wn, chunk,
                                        float(d2.final_logit_softcapping),
                                        float(d2.output_multiplier), int(d2.selector_top_k))
    cand, where, contains, has_term = selector_labels(top, gold, gold_insert)
    if alpha is None:
        loss = unary
        with torch.no_grad():
            scores = selector_scores(drafter, h, pred, cand)
    else:
        scores = selector_scores(drafter, h.detach() if stop_gradient else h, pred, cand)
        sel = (F.cross_entropy(scores, where, reduction="none") * wn * has_term).sum()
        loss = unary + alpha * sel
    with torch.no_grad():
        pick = cand.gather(1, scores.argmax(-1, keepdim=True)).squeeze(1)
        correct = (pick == gold) & contains
    return loss, step_metrics(loss, correct.view(b, n, bs - 1), cnt, denom)


def reference_dflash2_loss(drafter, hidden, labels, weights, *, alpha: float,
                           gold_insert: bool = False) -> torch.Tensor:
    """The same loss from full logits (unchunked; for tests)."""
    b, n, bs = labels.shape
    h = hidden.view(b, n, bs, -1)[:, :, 1:, :].reshape(-1, hidden.shape[-1])
    gold, pred = labels[:, :, 1:].reshape(-1), labels[:, :, :-1].reshape(-1)
    w = weights[:, :, 1:].reshape(-1)
    u = drafter.unary_logits(drafter.shared.lm_head(h))
    ce = F.cross_entropy(u, gold, reduction="none")
    cand, where, _, has_term = selector_labels(u.topk(drafter.d2.selector_top_k, -1).indices, gold,
                                               gold_insert)
    sel = F.cross_entropy(selector_scores(drafter, h, pred, cand), where, reduction="none")
    return ((ce + alpha * sel * has_term) * w).sum() / w.sum().clamp(min=1e-12)


def dflash2_forward_loss(drafter, features, block_ids, block_pos, ctx_pos, masks, labels, weights,
                         counted, backend: str, flex, chunk: int, gold_insert: bool,
                         stop_gradient: bool, selector: bool):
    """The DFlash2 step (compiled as ``dflash2_step``): the drafter's forward and ``dflash2_loss``
    (no selector term while the selector is frozen)."""
    attends = attention.layer_attends(backend, masks, flex=flex)
    hidden = drafter(features, block_ids, block_pos, attends, ctx_pos)
    return dflash2_loss(drafter, hidden, labels, weights, counted,
                        alpha=drafter.selector_alpha if selector else None, chunk=chunk,
                        gold_insert=gold_insert, stop_gradient=stop_gradient)
