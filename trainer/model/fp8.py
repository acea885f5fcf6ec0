"""FP8 weights for the frozen target's decoder layers (``model.target_fp8``, opt-in).

The target only runs forward, never trains, so its linear layers can hold their weights in
``float8_e4m3fn`` with one scale per output channel (computed once, here), and quantize
their input per row on the fly: ``y = (x_q * s_x) @ (W_q * s_w)^T``, one
``torch._scaled_mm`` with rowwise scales and a bf16 (the input's dtype) result. On an H200
the FP8 matrix units run twice the bf16 rate; compiled (``compile.target``), the per-row
quantization of the input fuses into the kernel before the product.

It changes the features the drafter learns from (a few percent relative error per layer),
not what the engines serve: a drafter trained this way is still served on the bf16 target.
Only the decoder layers' ``nn.Linear`` modules change; the embedding, the norms and the LM
head (shared with the drafter) keep their dtype.
"""

from __future__ import annotations

import torch
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)          # 448
_TINY = 1e-12


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_q [M, K] fp8, scale [M, 1] fp32): each row of the 2-D ``x`` scaled into fp8's range."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=_TINY)
    scale = amax / FP8_MAX
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


class Fp8Linear(nn.Module):
    """A frozen ``nn.Linear`` (no bias) with fp8 weights and rowwise scales.

    ``keep_full``: also keep the original weight, in host memory (pinned where CUDA is), so
    that ``served = True`` runs the full-precision product (evaluation on the target the
    engines serve); it is not a buffer, so neither ``.to()`` nor a state dict carries it."""

    def __init__(self, linear: nn.Linear, keep_full: bool = False):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("Fp8Linear: a linear layer with a bias is not converted")
        w = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype = w.dtype
        wq, ws = quantize_rows(w)                                      # [N, K], [N, 1]
        self.register_buffer("weight_fp8", wq)
        self.register_buffer("weight_scale", ws.t().contiguous())      # [1, N]
        self.full: torch.Tensor | None = None
        if keep_full:
            full = w.to("cpu", copy=True)
            self.full = full.pin_memory() if torch.cuda.is_available() else full
        self.served = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.served and self.full is not None:
            return nn.functional.linear(x, self.full.to(x.device, non_blocking=True))
        shape = x.shape
        xq, xs = quantize_rows(x.reshape(-1, shape[-1]))
        y = torch._scaled_mm(xq, self.weight_fp8.t(), scale_a=xs, scale_b=self.weight_scale,
                             out_dtype=x.dtype if x.is_floating_point() else self.out_dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 rowwise"


def convert_linears(module: nn.Module, keep_full: bool = False) -> int:
    """Replace every bias-free ``nn.Linear`` under ``module`` by an ``Fp8Linear`` (in place;
    ``keep_full``: as ``Fp8Linear``'s); returns how many were converted. Idempotent (an
    ``Fp8Linear`` is left alone)."""
    n = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and child.bias is None:
            setattr(module, name, Fp8Linear(child, keep_full))
            n += 1
        elif not isinstance(child, Fp8Linear):
            n += convert_linears(child, keep_full)
    return n
