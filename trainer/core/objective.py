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


# --------------------------------------------------------------------------- labels, weights

def position_decay(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """[B]: 0 for slot 0, exp(-(k-1)/gamma) for k >= 1."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    w = torch.exp(-(k - 1).clamp(min=0) / gamma)
    w[0] = 0.0
    return w


def labels_and_weights(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor,
                       valid: torch.Tensor, block_size: int, gamma: float):
    """labels [b,N,B] (x[anchor+k]), weights [b,N,B] (float), counted [b,N,B] (bool).

    ``counted`` marks the positions that count for loss and accuracy: valid block, k >= 1,
    loss_mask at the label.
    """
    b, s = input_ids.shape
    k = torch.arange(block_size, device=input_ids.device).view(1, 1, -1)
    raw = anchors.unsqueeze(-1) + k                                        # [b, N, B]
    idx = raw.clamp(max=s - 1)
    flat = idx.view(b, -1)
    labels = torch.gather(input_ids, 1, flat).view_as(idx)
    lm = torch.gather(loss_mask.bool(), 1, flat).view_as(idx)
    inside = raw < s           # a tail block past the padded row: no loss (clamped index)
    counted = lm & inside & valid.unsqueeze(-1) & (k >= 1)
    weights = position_decay(block_size, gamma, input_ids.device).view(1, 1, -1) * counted.float()
    return labels, weights, counted


# --------------------------------------------------------------------------- loss

class ChunkedLinearCE(torch.autograd.Function):
    """Weighted CE over a frozen LM head, chunked over rows; logits never fully materialized.

    forward(h [T,H], W [V,H], labels [T], w [T], chunk) -> (sum_t w_t*CE_t, correct [T])
    The gradient w.r.t. h is computed chunk by chunk during forward (W is frozen, so no
    gradient for it) and scaled by the incoming gradient in backward.
    """

    @staticmethod
    def forward(ctx, h, weight, labels, w, chunk: int):
        t = h.shape[0]
        need_grad = h.requires_grad
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        correct = torch.empty(t, dtype=torch.bool, device=h.device)
        grad_h = torch.empty_like(h) if need_grad else None
        vocab = torch.arange(weight.shape[0], device=h.device)
        with torch.autocast(device_type=h.device.type, enabled=False):
            for s in range(0, t, chunk):
                e = min(t, s + chunk)
                hc = h[s:e].to(weight.dtype)
                # logits stay in the head's dtype; every use upcasts on the fly (compiled, the
                # reductions and the gradient below are fused passes over the bf16 logits)
                logits = hc @ weight.t()                                   # [c, V]
                lf = logits.float()
                lab = labels[s:e]
                lse = torch.logsumexp(lf, dim=-1)
                tgt = lf.gather(1, lab.unsqueeze(1)).squeeze(1)
                wc = w[s:e].float()
                loss = loss + ((lse - tgt) * wc).sum()
                correct[s:e] = lf.argmax(dim=-1) == lab
                if need_grad:
                    # d(w*CE)/dlogits = w * (softmax - onehot): one pointwise expression, no scatter
                    onehot = (vocab.unsqueeze(0) == lab.unsqueeze(1)).float()
                    g = (torch.exp(lf - lse.unsqueeze(1)) - onehot) * wc.unsqueeze(1)
                    grad_h[s:e] = (g.to(weight.dtype) @ weight).to(h.dtype)
        ctx.mark_non_differentiable(correct)
        if need_grad:
            ctx.save_for_backward(grad_h)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss, grad_correct):
        (grad_h,) = ctx.saved_tensors
        return grad_h * grad_loss.to(grad_h.dtype), None, None, None, None


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
    loss, correct = ChunkedLinearCE.apply(h, lm_head_weight, lab, wn, chunk)
    corr = (correct.view(b, n, bs - 1) & cnt).float()
    metrics = {
        "loss": loss.detach(),
        "correct_per_pos": corr.sum(dim=(0, 1)),
        "count_per_pos": cnt.float().sum(dim=(0, 1)),
        "weight_sum": denom.detach(),
    }
    return loss, metrics


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

