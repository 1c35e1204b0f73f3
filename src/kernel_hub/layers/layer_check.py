"""The validate job's shared rules: a candidate layer's numbers, kernel against the layer's own forward, before
any swap.

Why one module: every kind is checked the same way (fresh random inputs of the layer's own shapes and dtype from a
private generator, so the user's RNG stream is untouched; numerics.relative_error against what the layer computes
now; the dtype's tolerance from numerics.TOLERANCE; in training mode the gradients too), and the verdict is
plan.verdict's. The inputs each kind is checked on are the kind's own (kinds/<kind>/validate.py).
"""

from __future__ import annotations

import math

import torch

from ..verify.numerics import TOLERANCE as TOLERANCES_BY_NAME
from ..verify.numerics import relative_error

#: Relative error (numerics.relative_error of kernel vs default) allowed per dtype: numerics.TOLERANCE, by torch dtype.
TOLERANCE = {getattr(torch, name): tol for name, tol in TOLERANCES_BY_NAME.items()}


def tolerance_for(dtype: torch.dtype) -> float:
    return TOLERANCE.get(dtype, 1e-4)


def rel_error(out: torch.Tensor | None, ref: torch.Tensor | None) -> float:
    """numerics.relative_error, where a gradient may be None on both sides (0) or one (inf)."""
    if out is None and ref is None:
        return 0.0
    if out is None or ref is None:
        return math.inf
    return relative_error(out, ref)


def dtype_device(module: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    p = next(module.parameters(), None)
    return (p.dtype, p.device) if p is not None else (torch.float32, torch.device("cpu"))
