"""Our masking semantics expressed through tokamax.dot_product_attention's arguments.

Ours (flash-attention-tpu's reference): query i of sequence b attends key j when i < q_len[b],
j < kv_len[b], and with `causal` j <= i + (kv_len[b] - q_len[b]) (bottom-right, as with a KV cache);
`sliding_window=W` keeps j > i + (kv_len[b] - q_len[b]) - W; rows with no key are 0.

Tokamax's `is_causal` is top-left (j <= i) and its `local_window_size` assumes Sq == Skv, so they mean
the same only when Sq == Skv and no lengths are given. Otherwise the wrapper passes an explicit boolean
mask [B, 1, Sq, Skv] built here. Tokamax returns the mean of v for rows with no key, so the wrapper
zeroes them (`rows_with_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class MaskPlan:
    """How one call's mask reaches Tokamax: "native" arguments or an "explicit" boolean mask."""

    mode: str
    why: str


def plan_mask(sq: int, skv: int, *, causal: bool, window: int | None, has_lengths: bool) -> MaskPlan:
    """Pure and static: native when Tokamax's own arguments mean exactly our semantics."""
    if not causal and window is None:
        return MaskPlan("native", "lengths only" if has_lengths else "no mask")
    if sq == skv and not has_lengths:
        return MaskPlan("native", "is_causal/local_window_size (Sq == Skv, no lengths)")
    reason = "per-sequence lengths" if has_lengths else f"Sq {sq} != Skv {skv}"
    return MaskPlan("explicit", f"bottom-right causal/window with {reason}: explicit [B,1,Sq,Skv] mask")


def lengths(x: Any, batch: int, full: int) -> jax.Array:
    """Valid lengths [B] clipped to [0, full]; None means every position is valid."""
    return jnp.full((batch,), full, jnp.int32) if x is None else jnp.clip(jnp.asarray(x, jnp.int32), 0, full)


def _positions(q_len: jax.Array, kv_len: jax.Array, sq: int) -> jax.Array:
    """[B, Sq]: each query's position on the key axis (bottom-right alignment)."""
    return jnp.arange(sq, dtype=jnp.int32)[None, :] + (kv_len - q_len)[:, None]


def explicit_mask(
    q_len: jax.Array, kv_len: jax.Array, sq: int, skv: int, *, causal: bool, window: int | None
) -> jax.Array:
    """[B, 1, Sq, Skv] boolean mask of our semantics."""
    i = jnp.arange(sq, dtype=jnp.int32)[None, :, None]
    j = jnp.arange(skv, dtype=jnp.int32)[None, None, :]
    pos = _positions(q_len, kv_len, sq)[:, :, None]
    mask = (i < q_len[:, None, None]) & (j < kv_len[:, None, None])
    if causal:
        mask &= j <= pos
    if window is not None:
        mask &= j > pos - window
    return mask[:, None]


def rows_with_keys(
    q_len: jax.Array, kv_len: jax.Array, sq: int, *, causal: bool, window: int | None
) -> jax.Array:
    """[B, Sq] True where the query row is valid and has at least one key to attend (O(B*Sq), closed form)."""
    pos = _positions(q_len, kv_len, sq)
    hi = jnp.minimum(kv_len[:, None], pos + 1) if causal else jnp.broadcast_to(kv_len[:, None], pos.shape)
    lo = jnp.maximum(pos - window + 1, 0) if window is not None else jnp.zeros_like(pos)
    return (jnp.arange(sq)[None, :] < q_len[:, None]) & (hi > lo)


def native_kwargs(
    skv: int, *, causal: bool, window: int | None, q_lengths: Any, kv_lengths: Any
) -> dict[str, Any]:
    """tokamax.dot_product_attention keyword arguments for a "native" plan."""
    kw: dict[str, Any] = {"is_causal": causal}
    if window is not None:  # (before, after) around the diagonal; Sq == Skv here
        kw["local_window_size"] = (window - 1, 0 if causal else skv)
    if q_lengths is not None:
        kw["query_seq_lengths"] = jnp.asarray(q_lengths, jnp.int32)
    if kv_lengths is not None:
        kw["key_value_seq_lengths"] = jnp.asarray(kv_lengths, jnp.int32)
    return kw
