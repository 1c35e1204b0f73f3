"""What a scale layer is checked on: ROWS random rows, the kernel against the layer's own forward, its weight held
(a kernel writing it is undone and refused)."""

from __future__ import annotations

import math
from typing import Any

import torch

from kernel_hub.layers.weights_guard import held_weights
from kernel_hub.verify.numerics import relative_error

ROWS = 8


def scale_error(module: Any, kernel: Any, seed: int) -> float:
    """Relative error of the kernel against the layer (inf where it returns another shape or dtype)."""
    weight = module.weight
    g = torch.Generator().manual_seed(seed)  # private generator: the user's RNG stream is untouched
    x = torch.randn(ROWS, weight.shape[0], generator=g).to(weight.device, weight.dtype)
    with torch.no_grad(), held_weights(module):
        ref = module.forward(x)
        out = kernel.scale_layer(x, weight)
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape or out.dtype != ref.dtype:
        return math.inf
    return relative_error(out, ref)
