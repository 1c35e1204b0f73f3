"""Operand shape checks shared by the JAX and torch entries of the ragged-dot and attention kernels.

Pure Python over shapes, so every entry (jax, torch, the Tokamax wrappers) refuses the same inputs with the same
ValueError naming the operand to fix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Shape = Sequence[int]


def check_ragged_dot_shapes(lhs: Shape, rhs: Shape, group_sizes: Shape) -> None:
    """lhs [M, K], rhs [G, K, N], group_sizes [G]."""
    lhs, rhs, group_sizes = tuple(lhs), tuple(rhs), tuple(group_sizes)
    if len(lhs) != 2 or len(rhs) != 3 or len(group_sizes) != 1:
        raise ValueError(f"ragged_dot wants lhs [M,K], rhs [G,K,N], group_sizes [G]; got {lhs}, {rhs}, {group_sizes}")
    if lhs[1] != rhs[1]:
        raise ValueError(f"ragged_dot shapes disagree: lhs {lhs} and rhs {rhs} differ in K")
    if group_sizes != (rhs[0],):
        raise ValueError(f"ragged_dot shapes disagree: group_sizes must have shape ({rhs[0]},), got {group_sizes}")


def check_attention_shapes(q: Shape, k: Shape, v: Shape, *, decode: bool = False) -> None:
    """q [B, Hq, Sq, D] (decode: [B, Hq, D]) over k, v [B, Hkv, Skv, D], Hq a multiple of Hkv."""
    q, k, v = tuple(q), tuple(k), tuple(v)
    nd = 3 if decode else 4
    if len(q) != nd or len(k) != 4 or len(v) != 4:
        raise ValueError(f"expected q with {nd} dims and 4-dim k/v, got {q}, {k}, {v}")
    if k != v:
        raise ValueError(f"k {k} and v {v} must match")
    if q[0] != k[0] or q[-1] != k[-1]:
        raise ValueError(f"batch/head_dim of q {q} and k {k} differ")
    if q[1] % k[1]:
        raise ValueError(f"query heads {q[1]} must be a multiple of kv heads {k[1]}")


def check_window(sliding_window: int | None) -> int | None:
    """A sliding window of at least one key (the query's own), or None."""
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    return None if sliding_window is None else int(sliding_window)


def check_soft_cap(logits_soft_cap: object, *, name: str = "logits_soft_cap") -> float | None:
    """A finite soft cap > 0, or None (no cap): an infinite cap gives inf/inf = NaN logits, a negative one flips
    every logit's sign, so both are refused rather than computed."""
    if logits_soft_cap is None:
        return None
    if isinstance(logits_soft_cap, bool):
        raise ValueError(f"{name} must be a number, got the bool {logits_soft_cap}")
    try:
        cap = float(logits_soft_cap)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {logits_soft_cap!r}") from None
    if not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"{name} must be a finite number > 0, or None (no cap); got {cap} (an infinite or NaN cap "
                         "turns every logit into NaN)")
    return cap


def check_attention(q: Shape, k: Shape, v: Shape, *, sliding_window: int | None, sm_scale: float | None,
                    logits_soft_cap: float | None, decode: bool = False) -> tuple[int | None, float, float | None]:
    """Every attention entry's argument check: the shapes, then (window, softmax scale, soft cap) as static Python
    numbers; the scale defaults to 1/sqrt(head_dim)."""
    check_attention_shapes(q, k, v, decode=decode)
    scale = float(sm_scale) if sm_scale is not None else 1.0 / math.sqrt(tuple(q)[-1])
    return check_window(sliding_window), scale, check_soft_cap(logits_soft_cap)
