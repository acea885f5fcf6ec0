"""Drafter replicas kept identical: gradient averaging and the equality check at save time."""

from __future__ import annotations

from typing import Sequence


class ReplicaDivergence(RuntimeError):
    """Drafter replicas no longer hold identical parameters (a bug; exit 5)."""


def _params(model) -> list:
    if hasattr(model, "trainable_parameters"):
        return list(model.trainable_parameters())
    return [p for p in model.parameters() if p.requires_grad]


def _state(model) -> dict:
    if hasattr(model, "trainable_state_dict"):
        return model.trainable_state_dict()
    return model.state_dict()


def broadcast_params(models: Sequence) -> None:
    """Copy replica 0's parameters and buffers into every other replica."""
    import torch

    src = _state(models[0])
    with torch.no_grad():
        for m in models[1:]:
            for k, v in _state(m).items():
                v.copy_(src[k].to(v.device))


def average_grads(models: Sequence) -> None:
    """Replace every replica's gradients by the mean over replicas (sum in fp32, then divide).

    The order of summation is fixed (replica 0, 1, ...), and every replica receives the same
    bits, so identical optimizers keep the replicas identical.
    """
    import torch

    if len(models) <= 1:
        return
    n = len(models)
    with torch.no_grad():
        for group in zip(*(_params(m) for m in models), strict=True):
            grads = [p.grad for p in group]
            if all(g is None for g in grads):
                continue
            dev0 = group[0].device
            acc = torch.zeros_like(group[0], dtype=torch.float32, device=dev0)
            for g in grads:
                if g is not None:
                    acc += g.to(dev0, dtype=torch.float32)
            acc /= n
            for p in group:
                mean = acc.to(p.device, dtype=p.dtype)
                if p.grad is None:
                    p.grad = mean
                else:
                    p.grad.copy_(mean)


def check_equal(models: Sequence, *, atol: float = 0.0) -> None:
    """Raise ReplicaDivergence naming the first parameter that differs across replicas."""
    import torch

    if len(models) <= 1:
        return
    ref = {k: v.detach() for k, v in _state(models[0]).items()}
    for r, m in enumerate(models[1:], start=1):
        for k, v in _state(m).items():
            a = ref[k]
            b = v.detach().to(a.device)
            if a.shape != b.shape:
                raise ReplicaDivergence(f"drafter replica {r}: {k} has shape {tuple(b.shape)}, "
                                        f"replica 0 has {tuple(a.shape)}")
            diff = (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
            if not diff <= atol or not torch.isfinite(torch.tensor(diff)):
                raise ReplicaDivergence(f"drafter replica {r}: parameter {k} differs from "
                                        f"replica 0 by {diff:.3g} (> {atol}); replicas must stay "
                                        "identical (gradient averaging bug?)")
