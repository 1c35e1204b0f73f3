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
    return check_eps(eps, "rms_norm")


def check_eps(eps: Any, who: str) -> float:
    """eps as a float >= 0; ValueError naming `who` otherwise."""
    try:
        eps = float(eps)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: eps must be a number, got {eps!r}") from None
    if not eps >= 0.0:
        raise ValueError(f"{who}: eps must be >= 0, got {eps}")
    return eps


def check_qk_rope_operands(qkv_shape: Sequence[int], q_weight_shape: Sequence[int], k_weight_shape: Sequence[int],
                           cos_shape: Sequence[int], sin_shape: Sequence[int], *, q_heads: Any, kv_heads: Any,
                           eps: Any, values: Any, keys_are_values: Any, rotary_dims: Any,
                           name: str = "qk_norm_rope", projected: str = "qkv") -> dict[str, Any]:
    """qk_norm_rope's static facts (q_heads, kv_heads, head_dim, half, eps, values, keys_are_values); one
    ValueError naming what to fix for a bad shape, head count, mode or eps. `name` is the entry the message names,
    `projected` what holds the heads (qkv_shape's second axis is its heads x head_dim)."""
    if not (isinstance(q_heads, int) and isinstance(kv_heads, int) and q_heads > 0 and kv_heads > 0):
        raise ValueError(f"{name}: q_heads and kv_heads must be positive ints, got {q_heads!r}, {kv_heads!r}")
    if values not in ("raw", "normed"):
        raise ValueError(f"{name}: values must be 'raw' or 'normed', got {values!r}")
    heads = q_heads + kv_heads * (1 if keys_are_values else 2)
    if len(qkv_shape) != 2 or qkv_shape[1] % heads:
        raise ValueError(f"{name}: {projected} must hold {heads} heads x head_dim ({q_heads} query + {kv_heads} key"
                         f"{'' if keys_are_values else f' + {kv_heads} value'} heads) on its last axis, got "
                         f"{qkv_shape[-1] if qkv_shape else ()} in {tuple(qkv_shape)}")
    d = qkv_shape[1] // heads
    for what, shape in (("q_weight", q_weight_shape), ("k_weight", k_weight_shape)):
        if tuple(shape) != (d,):
            raise ValueError(f"{name}: {what} must have shape ({d},) (head_dim), got {tuple(shape)}")
    for what, shape in (("cos", cos_shape), ("sin", sin_shape)):
        if tuple(shape) != (qkv_shape[0], d):
            raise ValueError(f"{name}: {what} must have shape ({qkv_shape[0]}, {d}) ([T, head_dim]: rope_tables), "
                             f"got {tuple(shape)}")
    rot = d if rotary_dims is None else rotary_dims
    if not isinstance(rot, int) or rot <= 0 or rot % 2 or rot > d:
        raise ValueError(f"{name}: rotary_dims must be an even int in (0, head_dim={d}], got {rotary_dims!r}")
    eps = check_eps(eps, name)
    return {"q_heads": q_heads, "kv_heads": kv_heads, "head_dim": d, "half": rot // 2, "eps": eps, "values": values,
            "keys_are_values": bool(keys_are_values)}
