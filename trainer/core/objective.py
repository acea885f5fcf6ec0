"""The DFlash training objective: labels, weights, loss, metrics.

Shapes and the block geometry (anchors, block inputs, visibility) are trainer.model.blocks'.

- **Labels.** Slot k predicts ``x[anchor+k]`` for k = 1..B-1; slot 0 has no loss.
- **Loss.** ``sum(w * CE) / sum(w)``, ``w_k = exp(-(k-1)/gamma) * loss_mask[anchor+k]``.
- **Metrics.** Per-position accuracy; tau = 1 + sum_k prod_{j<=k} acc_j (expected
  accepted drafts + the target's bonus token, assuming independent positions).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model import attention


# --------------------------------------------------------------------------- labels, weights

def position_decay(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """[B]: 0 for slot 0, exp(-(k-1)/gamma) for k >= 1."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    w = torch.exp(-(k - 1).clamp(min=0) / gamma)
    w[0] = 0.0
    return w


def labels_and_weights(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor,
                       valid: torch.Tensor, block_size: int, gamma: float,
                       doc_hi: torch.Tensor | None = None):
    """labels [b,N,B] (x[anchor+k]), weights [b,N,B] (float), counted [b,N,B] (bool).

    ``counted`` marks the positions that count for loss and accuracy: valid block, k >= 1,
    loss_mask at the label, the label inside the row (``doc_hi`` [b, N], packed rows: inside
    the anchor's own sample).
    """
    b, s = input_ids.shape
    k = torch.arange(block_size, device=input_ids.device).view(1, 1, -1)
    raw = anchors.unsqueeze(-1) + k                                        # [b, N, B]
    idx = raw.clamp(max=s - 1)
    flat = idx.view(b, -1)
    labels = torch.gather(input_ids, 1, flat).view_as(idx)
    lm = torch.gather(loss_mask.bool(), 1, flat).view_as(idx)
    # a tail block past the padded row (packed: past its sample): no loss (clamped index)
    inside = raw < (s if doc_hi is None else doc_hi.unsqueeze(-1))
    counted = lm & inside & valid.unsqueeze(-1) & (k >= 1)
    weights = position_decay(block_size, gamma, input_ids.device).view(1, 1, -1) * counted.float()
    return labels, weights, counted


# --------------------------------------------------------------------------- loss

def topk_ids(x: torch.Tensor, k: int, segment: int = 128) -> torch.Tensor:
    """[T, k]: the indices of the k largest entries of each row of ``x`` [T, V], largest first.

    Two stages instead of one radix select over the whole row: each row's maximum per
    segment of ``segment`` columns (one fused pass), the k segments with the largest maxima,
    then the top k among those k * ``segment`` columns. Exact: a column larger than the
    k-th chosen segment's maximum lies in a chosen segment, and the chosen maxima are k
    columns at least that large. (Among equal values the index may differ from
    ``torch.topk``'s.)"""
    t, v = x.shape
    if k <= 0 or v <= 4 * k * segment:
        return x.topk(k, dim=-1).indices
    whole = v // segment * segment
    seg_max = x[:, :whole].reshape(t, whole // segment, segment).amax(-1)
    if whole < v:
        seg_max = torch.cat([seg_max, x[:, whole:].amax(-1, keepdim=True)], dim=-1)
    seg = seg_max.topk(k, dim=-1).indices                                  # [T, k]
    cols = (seg.unsqueeze(-1) * segment
            + torch.arange(segment, device=x.device)).reshape(t, k * segment)
    inside = cols < v                                     # the short last segment's overhang
    vals = x.gather(1, cols.clamp(max=v - 1))
    vals = torch.where(inside, vals, torch.full_like(vals, float("-inf")))
    return cols.gather(1, vals.topk(k, dim=-1).indices)


class ChunkedHeadCE(torch.autograd.Function):
    """Weighted CE over a frozen LM head, chunked over rows; logits never fully materialized.

    forward(h [T,H], W [V,H], labels [T], w [T], chunk, cap=0, mult=1, k=0)
    -> (sum_t w_t*CE_t, correct [T] (argmax == label), top [T, k] (the k best ids; [T, 0]
    for k = 0)). The scores are the logits ``h W^T``, or with ``cap`` > 0 the soft-capped
    ``cap * tanh(h W^T * mult / cap)`` (DFlash2's unary logits). The gradient w.r.t. h is
    computed chunk by chunk during forward (W is frozen, so no gradient for it) and scaled
    by the incoming gradient in backward.
    """

    @staticmethod
    def forward(ctx, h, weight, labels, w, chunk: int, cap: float = 0.0, mult: float = 1.0,
                k: int = 0):
        t = h.shape[0]
        need_grad = h.requires_grad
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        correct = torch.empty(t, dtype=torch.bool, device=h.device)
        top = torch.empty(t, k, dtype=torch.long, device=h.device)
        grad_h = torch.empty_like(h) if need_grad else None
        vocab = torch.arange(weight.shape[0], device=h.device)
        with torch.autocast(device_type=h.device.type, enabled=False):
            for s in range(0, t, chunk):
                e = min(t, s + chunk)
                # logits stay in the head's dtype; every use upcasts on the fly (compiled, the
                # reductions and the gradient below are fused passes over the bf16 logits)
                logits = h[s:e].to(weight.dtype) @ weight.t()                # [c, V]
                lf = logits.float()
                if cap > 0:
                    th = torch.tanh(lf * (mult / cap))
                    u = th * cap
                else:
                    u = lf
                lab = labels[s:e]
                lse = torch.logsumexp(u, dim=-1)
                tgt = u.gather(1, lab.unsqueeze(1)).squeeze(1)
                wc = w[s:e].float()
                loss = loss + ((lse - tgt) * wc).sum()
                correct[s:e] = u.argmax(dim=-1) == lab
                if k:
                    # the scores rise with the logits (mult > 0): the same top k from the
                    # head's own output, without an fp32 copy of the chunk's scores
                    top[s:e] = topk_ids(logits if cap <= 0 or mult > 0 else u, k)
                if grad_h is not None:
                    # d(w*CE)/dscores = w * (softmax - onehot): one pointwise expression, no
                    # scatter; the soft cap's derivative folded in
                    onehot = (vocab.unsqueeze(0) == lab.unsqueeze(1)).float()
                    g = (torch.exp(u - lse.unsqueeze(1)) - onehot) * wc.unsqueeze(1)
                    if cap > 0:
                        g = g * (1.0 - th * th) * mult
                    grad_h[s:e] = (g.to(weight.dtype) @ weight).to(h.dtype)
        ctx.mark_non_differentiable(correct, top)
        if need_grad:
            ctx.save_for_backward(grad_h)
        return loss, correct, top

    @staticmethod
    def backward(ctx, grad_loss, grad_correct, grad_top):
        (grad_h,) = ctx.saved_tensors
        return grad_h * grad_loss.to(grad_h.dtype), None, None, None, None, None, None, None


def weighted_ce(hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor,
                weights: torch.Tensor, counted: torch.Tensor, chunk: int = 2048):
    """Loss ``sum(w*CE)/sum(w)`` over slots 1..B-1 and the metric tensors (no ``.item()``).

    hidden [b, N*B, H]; labels/weights/counted [b, N, B]. Slot 0 rows are dropped statically.
    Returns (loss, metrics) with metrics: ``loss`` (detached), ``correct_per_pos`` and
    ``count_per_pos`` ([B-1] float sums), ``weight_sum``.
    """
    b, n, bs = labels.shape
    h = hidden.view(b, n, bs, -1)[:, :, 1:, :].reshape(-1, hidden.shape[-1])
    lab = labels[:, :, 1:].reshape(-1)
    w = weights[:, :, 1:].reshape(-1)
    cnt = counted[:, :, 1:]
    denom = w.sum()
    wn = w / denom.clamp(min=1e-12)
    loss, correct, _ = ChunkedHeadCE.apply(h, lm_head_weight, lab, wn, chunk)
    return loss, step_metrics(loss, correct.view(b, n, bs - 1), cnt, denom)


def step_metrics(loss: torch.Tensor, correct: torch.Tensor, counted: torch.Tensor,
                 weight_sum: torch.Tensor) -> dict[str, torch.Tensor]:
    """The metric tensors of one micro-batch (no ``.item()``): ``correct``/``counted``
    [b, N, B-1] per slot 1..B-1."""
    corr = (correct & counted).float()
    return {"loss": loss.detach(), "correct_per_pos": corr.sum(dim=(0, 1)),
            "count_per_pos": counted.float().sum(dim=(0, 1)), "weight_sum": weight_sum.detach()}


def reference_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Plain (unchunked) ``sum(w*CE)/sum(w)`` from full logits [b, N*B, V] (for tests)."""
    b, n, bs = labels.shape
    ce = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1),
                         reduction="none").view(b, n, bs)
    return (ce * weights).sum() / weights.sum().clamp(min=1e-12)


# --------------------------------------------------------------------------- metrics

def tau_from_acc(acc_per_pos: torch.Tensor) -> torch.Tensor:
    """Expected acceptance length: 1 + sum_k prod_{j<=k} acc_j (acc over slots 1..B-1)."""
    return 1.0 + torch.cumprod(acc_per_pos.float(), dim=0).sum()


def summarize(metrics: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Combine the metric tensors of several micro-batches (still on device, no sync).

    loss: mean of the micro-batch losses; acc: over all counted positions; tau from the
    pooled per-position accuracy.
    """
    loss = torch.stack([m["loss"].float() for m in metrics]).mean()
    corr = torch.stack([m["correct_per_pos"] for m in metrics]).sum(0)
    cnt = torch.stack([m["count_per_pos"] for m in metrics]).sum(0)
    acc_pos = corr / cnt.clamp(min=1.0)
    acc = corr.sum() / cnt.sum().clamp(min=1.0)
    return {"loss": loss, "acc": acc, "acc_per_pos": acc_pos, "tau": tau_from_acc(acc_pos),
            "label_tokens": cnt.sum()}


def expected_tau_uniform(acc: float, block_size: int) -> float:
    """tau when every position has accuracy ``acc`` (docs/tests helper)."""
    return 1.0 + sum(acc ** k for k in range(1, block_size))


def dflash_forward_loss(drafter, features, block_ids, block_pos, ctx_pos, masks, labels, weights,
                        counted, backend: str, flex, chunk: int):
    """The DFlash step (compiled as ``drafter_step``): the drafter's forward and ``weighted_ce``."""
    attends = attention.layer_attends(backend, masks, flex=flex)
    hidden = drafter(features, block_ids, block_pos, attends, ctx_pos)
    return weighted_ce(hidden, drafter.shared.lm_head.weight, labels, weights, counted,
                       chunk=chunk)
