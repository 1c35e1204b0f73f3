"""The dense formulation of a device's experts (moe/formulation.py): every token through each routed local expert.

    dense_local(x[T,H], ids[T,k], weights[T,k], w_gate_up, w_down, first, ...) -> [T,H] partial sum (x's dtype)

The routing becomes gate_w [T, El] (the weight token t gives local expert e, summed over its slots; 0 where it did
not pick e), and `order`, the local experts some token picked first, `count` of them. The Pallas kernel
(pallas/dense_experts.py) walks `order` and reads no weights of an expert nobody picked. Its gradient is the sorted
formulation's (the same function: its ragged dots' backward kernels), so training memory does not change;
`xla_dense`, the same arithmetic in XLA, runs where the kernel does not (CPU, GPU).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ..pallas.dense_experts import dense_experts
from .formulation import padded_rows

GateUp = Any


def routing_columns(ids: jax.Array, weights: jax.Array, first: jax.Array, experts: int
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(gate_w [T, El] f32, order [El] int32, count [1] int32) for local experts first .. first + El - 1; ids outside
    them contribute nothing."""
    local = ids.astype(jnp.int32) - first
    hit = local[:, :, None] == jnp.arange(experts, dtype=jnp.int32)
    gate_w = jnp.sum(jnp.where(hit, weights.astype(jnp.float32)[:, :, None], 0.0), axis=1)
    picked = jnp.any(hit, axis=(0, 1))
    order = jnp.argsort(jnp.logical_not(picked), stable=True).astype(jnp.int32)
    return gate_w, order, jnp.sum(picked, dtype=jnp.int32).reshape(1)


def _split(w_gu: GateUp, i: int) -> tuple[jax.Array, jax.Array]:
    return w_gu if isinstance(w_gu, tuple) else (w_gu[..., :i], w_gu[..., i:])


def xla_dense(x: jax.Array, gate_w: jax.Array, w_gu: GateUp, w_down: jax.Array, activation: Callable,
              layer: jax.Array | None = None) -> jax.Array:
    """The same arithmetic as the kernel in XLA: [T, H] f32. Every token through every local expert."""
    i = w_down.shape[-2]
    wg, wu = _split(w_gu, i)
    if layer is not None:
        wg, wu, w_down = wg[layer], wu[layer], w_down[layer]
    prec = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
    proj = functools.partial(jnp.einsum, "th,ehi->eti", precision=prec, preferred_element_type=jnp.float32)
    a = activation(proj(x, wg)) * proj(x, wu) * gate_w.T[:, :, None]
    return jnp.einsum("eti,eih->th", a.astype(x.dtype), w_down, precision=prec, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _kernel_call(x, ids, weights, w_gu, w_down, first, layer, static):
    activation, ti, vmem_limit, interpret, _ = static
    t = x.shape[0]
    gate_w, order, count = routing_columns(ids, weights, first, w_down.shape[-3])
    tp = padded_rows(t)
    if tp != t:
        x, gate_w = jnp.pad(x, ((0, tp - t), (0, 0))), jnp.pad(gate_w, ((0, tp - t), (0, 0)))
    out = dense_experts(x, jnp.take(gate_w, order, axis=1), order, count, w_gu, w_down, activation=activation,
                        ti=ti, vmem_limit_bytes=vmem_limit, interpret=interpret, layer=layer)
    return out if tp == t else out[:t]


def _fwd(x, ids, weights, w_gu, w_down, first, layer, static):
    return _kernel_call(x, ids, weights, w_gu, w_down, first, layer, static), (x, ids, weights, w_gu, w_down, first,
                                                                              layer)


def _bwd(static, res, g):
    x, ids, weights, w_gu, w_down, first, layer = res
    sorted_rows = static[4]
    _, vjp = jax.vjp(lambda a, w, gu, d: sorted_rows(a, ids, w, gu, d, first, layer).astype(a.dtype),
                     x, weights, w_gu, w_down)
    dx, dw, dgu, ddown = vjp(g)
    return dx, None, dw, dgu, ddown, None, None


_kernel_call.defvjp(_fwd, _bwd)


def dense_local(x: jax.Array, ids: jax.Array, weights: jax.Array, w_gu: GateUp, w_down: jax.Array,
                first: jax.Array, *, activation: Callable, pallas: bool, ti: int | None,
                vmem_limit: int | None, interpret: Any, sorted_rows: Callable, layer: jax.Array | None = None
                ) -> jax.Array:
    """Partial [T, H] output of this device's experts (first .. first + El - 1) over every token, in x's dtype
    (summed over the experts in f32): the Pallas kernel when `pallas` (with I tile `ti`,
    moe/formulation.dense_tile), else xla_dense. The kernel's gradient is that of `sorted_rows` (the sorted
    formulation of the same block, same arguments: its ragged dots' backward kernels keep no [E, T, I] temporaries),
    xla_dense's is jax's."""
    if not pallas:
        gate_w, _, _ = routing_columns(ids, weights, first, w_down.shape[-3])
        return xla_dense(x, gate_w, w_gu, w_down, activation, layer).astype(x.dtype)
    static = (activation, ti or w_down.shape[-2], vmem_limit, interpret, sorted_rows)
    return _kernel_call(x, ids, weights, w_gu, w_down, first, layer, static)
