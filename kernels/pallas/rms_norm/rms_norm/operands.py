"""The operand rule both entries enforce (JAX and torch), on shapes only, so the torch-cpu build checks the same way
without importing jax."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def check_operands(x_shape: Sequence[int], w_shape: Sequence[int], eps: Any) -> float:
    """eps as a float; ValueError naming what to fix for a bad shape or eps."""
    if len(x_shape) < 1:
        raise ValueError("rms_norm: x must have at least one axis (the hidden axis is the last)")
    if tuple(w_shape) != (x_shape[-1],):
        raise ValueError(f"rms_norm: weight must have shape ({x_shape[-1]},) (x's last axis), got {tuple(w_shape)}")
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise ValueError(f"rms_norm: eps must be a number, got {eps!r}") from None
    if not eps >= 0.0:
        raise ValueError(f"rms_norm: eps must be >= 0, got {eps}")
    return eps
