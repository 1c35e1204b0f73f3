"""Torch-native RMSNorm with the package's semantics (formula.py), for the torch-cpu build: float32 arithmetic,
output in x's dtype, either form and either cast order; differentiable through torch autograd. Imports torch only."""

from __future__ import annotations

import torch


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, *, eps: float, zero_centered: bool,
                   scale_after_cast: bool) -> torch.Tensor:
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if scale_after_cast and not zero_centered and weight.dtype == x.dtype:
        # one multiply in x's dtype: for bf16 the exact f32 product rounded once, as the f32 route below gives
        return weight * n.to(x.dtype)
    if scale_after_cast:
        n = n.to(x.dtype).float()
    scale = weight.float() + 1.0 if zero_centered else weight.float()
    return (n * scale).to(x.dtype)
