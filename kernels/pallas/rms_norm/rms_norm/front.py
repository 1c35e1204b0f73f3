"""`attention_front`: from the residual stream to the attention's q, k and v in one call (the JAX entry).

A decoder layer's attention starts with four ops that each move a few hundred kilobytes at decode: the residual
add, the input RMSNorm, the fused q/k/v projection and the q/k norms with the rotary embedding. Run apart they are
three kernel calls or XLA ops a layer, each with a TPU op's fixed cost, and a [T, heads x D] intermediate through
HBM; here they are one Pallas call (pallas_front.py), or, on the "xla" path, the same arithmetic on whole arrays.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from . import formula
from ._vendor.interpret import run_dispatch
from ._vendor.layer_index import layer_index
from .api import _DISPATCH, _qk_rope_xla, _row
from .config import RMSNormConfig, block_rows
from .operands import check_eps, check_qk_rope_operands
from .pallas_front import FrontStatic, front_forward, heads_in, project
from .pallas_qk_rope import QKRopeStatic
from .xla_gradient import with_xla_gradient


def _front_xla(st: FrontStatic, layer, x, residual, norm_stack, w_stack, q_stack, k_stack, cos, sin):
    """The kernel's arithmetic on whole arrays: (q, k, v) or (q, k, v, x + residual)."""
    total = x
    if residual is not None:
        total = (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
    xn = formula.forward(total, _row(norm_stack, layer), eps=st.rope.eps, zero_centered=st.zero_centered,
                         scale_after_cast=st.scale_after_cast)
    qkv = project(xn, _row(w_stack, layer))
    out = _qk_rope_xla(st.rope, layer, qkv, q_stack, k_stack, cos, sin)
    return (*out, total) if residual is not None else out


_front = with_xla_gradient(lambda st, layer, *args: front_forward(st, *args, layer), _front_xla)


@functools.partial(jax.jit, static_argnames=("impl", "st"))
def _run_front(x, residual, norm_stack, w_stack, q_stack, k_stack, cos, sin, layer, *, impl, st):
    if impl == "pallas" and st.rope.head_dim % 128:
        raise NotImplementedError(f"attention_front's Pallas kernel writes one head per step on the lanes: head_dim "
                                  f"must be a multiple of 128, got {st.rope.head_dim}")
    return _front(impl, st, layer, x, residual, norm_stack, w_stack, q_stack, k_stack, cos, sin)


def _stacks(layer, norm_weight, wqkv, q_weight, k_weight):
    """The four weights as stacks over layers and the layer as an int32 0-d array (a stack of one at 0 when
    layer is None); ValueError when `layer=` is given without stacks."""
    if layer is None:
        return norm_weight[None], wqkv[None], q_weight[None], k_weight[None], jnp.zeros((), jnp.int32)
    if norm_weight.ndim != 2 or wqkv.ndim != 3 or q_weight.ndim != 2 or k_weight.ndim != 2:
        raise ValueError(f"attention_front: with layer=, every weight must be stacked over layers (norm_weight "
                         f"[L, H], wqkv [L, H, heads x D], q_weight and k_weight [L, D]); got {norm_weight.shape}, "
                         f"{wqkv.shape}, {q_weight.shape}, {k_weight.shape}")
    count = norm_weight.shape[0]
    if {wqkv.shape[0], q_weight.shape[0], k_weight.shape[0]} != {count}:
        raise ValueError(f"attention_front: the weight stacks hold different layer counts: {norm_weight.shape[0]}, "
                         f"{wqkv.shape[0]}, {q_weight.shape[0]}, {k_weight.shape[0]}")
    return norm_weight, wqkv, q_weight, k_weight, layer_index(layer, count, "attention_front")


def attention_front(
    x: jax.Array,
    norm_weight: jax.Array,
    wqkv: jax.Array,
    q_weight: jax.Array,
    k_weight: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    *,
    q_heads: int,
    kv_heads: int,
    eps: float,
    residual: jax.Array | None = None,
    zero_centered: bool = False,
    scale_after_cast: bool = False,
    values: str = "raw",
    keys_are_values: bool = False,
    rotary_dims: int | None = None,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
    config: RMSNormConfig | None = None,
    layer: int | jax.Array | None = None,
) -> tuple[jax.Array, ...]:
    """A q/k-normed attention's front in one call: `rms_norm(x (+ residual))`, its projection by `wqkv`, then
    `qk_norm_rope` of that projection. Why one op: at decode each of them moves a few hundred kilobytes, so what
    they cost on a TPU is the ops themselves (three a layer) and the projection's round trip through HBM.

    Args:
      x: [T, H] (bf16 or f32); residual: None, or the residual stream (x's shape and dtype), added to x first as
        `rms_norm(residual=)` does (the sum, rounded to x's dtype, is returned too).
      norm_weight: [H] the input norm's weight (forms and cast order as `rms_norm`'s zero_centered and
        scale_after_cast). wqkv: [H, heads x D] in x's dtype, one device's query heads, then key heads, then value
        heads (none with keys_are_values) side by side. q_weight, k_weight: [D] the q and k norms' weights.
      cos, sin: [T, D] float32 rotary tables (`rope_tables`). q_heads, kv_heads, values, keys_are_values,
        rotary_dims: as `qk_norm_rope`; eps: every norm's epsilon (the models using this share one).
      implementation / interpret / config: the kernel contract (as `rms_norm`); config: RMSNormConfig rows per
        grid step.
      layer: None, or an integer scalar (possibly traced: a scan's counter) with every weight stacked over layers
        (norm_weight [L, H], wqkv [L, H, heads x D], q_weight and k_weight [L, D]): that layer's weights, read inside
        the kernel, so a scanned model takes no slice of any of them.

    Returns:
      (q [T, q_heads, D], k [T, kv_heads, D], v [T, kv_heads, D]) in x's dtype, and x + residual when residual is
      given. The projection is accumulated in float32 and rounded to x's dtype before the q/k norms (as a separate
      projection's output is stored); the norms and the rotary run in float32. Differentiable in every array
      argument (the gradient is jax's of the XLA arithmetic); the Pallas kernel takes head_dim a multiple of 128.
    """
    x, norm_weight, wqkv = jnp.asarray(x), jnp.asarray(norm_weight), jnp.asarray(wqkv)
    q_weight, k_weight, cos, sin = (jnp.asarray(a) for a in (q_weight, k_weight, cos, sin))
    norm_stack, w_stack, q_stack, k_stack, at = _stacks(layer, norm_weight, wqkv, q_weight, k_weight)
    if x.ndim != 2 or norm_stack.shape[1:] != (x.shape[1],) or w_stack.shape[1] != x.shape[1]:
        raise ValueError(f"attention_front: x must be [T, H] with norm_weight [H] and wqkv [H, heads x D] (stacked "
                         f"over layers with layer=); got {x.shape}, {norm_weight.shape}, {wqkv.shape}")
    if w_stack.dtype != x.dtype:
        raise ValueError(f"attention_front: wqkv must have x's dtype {x.dtype}, got {w_stack.dtype}")
    if residual is not None:
        residual = jnp.asarray(residual)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"attention_front: residual must have x's shape and dtype {x.shape} {x.dtype}, got "
                             f"{residual.shape} {residual.dtype}")
    check_eps(eps, "attention_front")
    rope = check_qk_rope_operands((x.shape[0], w_stack.shape[2]), q_stack.shape[1:], k_stack.shape[1:], cos.shape,
                                  sin.shape, q_heads=q_heads, kv_heads=kv_heads, eps=eps, values=values,
                                  keys_are_values=keys_are_values, rotary_dims=rotary_dims,
                                  name="attention_front", projected="wqkv")
    d = rope["head_dim"]
    if x.shape[0] == 0:
        empty = tuple(jnp.zeros((0, n, d), x.dtype) for n in (q_heads, kv_heads, kv_heads))
        return (*empty, jnp.zeros(x.shape, x.dtype)) if residual is not None else empty
    cfg = config or RMSNormConfig()

    def run(impl: str, mode: Any):
        rq = QKRopeStatic(block_rows=block_rows(x.shape[0], x.shape[1], cfg), interpret=mode, **rope)
        st = FrontStatic(rq, bool(zero_centered), bool(scale_after_cast), residual is not None)
        return _run_front(x, residual, norm_stack, w_stack, q_stack, k_stack, cos, sin, at,
                          impl="xla" if impl == "autodiff" else impl, st=st)

    return run_dispatch(_DISPATCH, implementation, interpret, (x, wqkv), run, "the attention front kernel")


__all__ = ["attention_front", "heads_in"]
