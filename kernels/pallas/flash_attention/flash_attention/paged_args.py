"""Scalar arguments of the paged entries (the JAX entry, its torch twin and flash-attn's paged calls), checked one way.

Pure Python (no jax, no torch import: the torch-cpu build runs without jax), so every entry refuses the same values
with one ValueError naming the argument: a count must be an integer (2.5 or NaN is not silently truncated), a soft
cap finite and positive (inf or NaN would turn every logit into NaN).
"""

from __future__ import annotations

import math
import operator
from typing import Any


def int_arg(who: str, name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """`value` as a Python int within [low, high], or ValueError naming `name`. Integer scalars of any library
    (numpy, jax, torch 0-d) are taken; bools, floats and strings are refused rather than rounded."""
    if isinstance(value, bool):
        raise ValueError(f"{who}: {name} must be an integer, got the bool {value}")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{who}: {name} must be an integer, got {value!r}") from None
    if (low is not None and n < low) or (high is not None and n > high):
        if low is not None and high is not None:
            want = f"in [{low}, {high}]"
        else:
            want = f">= {low}" if low is not None else f"<= {high}"
        raise ValueError(f"{who}: {name} must be {want}, got {n}")
    return n


def window_arg(who: str, value: Any) -> int | None:
    """A sliding window of at least one position (the query's own), or None."""
    return None if value is None else int_arg(who, "sliding_window", value, low=1)


def soft_cap_arg(who: str, value: Any, *, name: str = "soft_cap", zero_is_none: bool = False) -> float | None:
    """A finite soft cap > 0, or None (no cap). `zero_is_none`: flash-attn's convention, softcap=0.0 means no cap."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{who}: {name} must be a number, got the bool {value}")
    try:
        cap = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: {name} must be a number, got {value!r}") from None
    if zero_is_none and cap == 0.0:
        return None
    if not (math.isfinite(cap) and cap > 0):
        none = "0 (no cap)" if zero_is_none else "None (no cap)"
        raise ValueError(f"{who}: {name} must be a finite number > 0, or {none}; got {cap} (an infinite or NaN "
                         "cap turns every logit into NaN)")
    return cap


def scale_arg(who: str, name: str, value: Any) -> float | None:
    """A KV cache scale (k_scale / v_scale): a finite number > 0, or None (1.0 for an fp8 cache)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{who}: {name} must be a number, got the bool {value}")
    try:
        scale = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: {name} must be a Python number (a static per-cache scale), got {value!r}") from None
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{who}: {name} must be a finite number > 0, got {scale}")
    return scale
