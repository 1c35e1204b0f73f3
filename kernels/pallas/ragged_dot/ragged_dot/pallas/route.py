"""The Pallas kernel of `moe_route`: router logits, their top k and the softmax over those k, in one call; optionally
with the norm before the router (the residual add and the RMSNorm whose output the router and the experts read) and
a per-expert scale on the weights (Gemma 4), in the same call.

x [T, H] and one layer's router weight [H, E] are read into VMEM, the logits are one f32 MXU dot, and the top k are
picked by k rounds over the experts' lanes (the row's maximum, the first expert holding it, that expert masked out),
so ties go to the lower expert as jax.lax.top_k sends them. The ids and weights are assembled on 128 lanes and
stored as [T, k]. Grid: one step per block of tokens, independent ("parallel").

The weights' producers may be fused into the call (allow_input_fusion): a layer sliced out of a stack [L, H, E] (or
a norm's [L, H], a scale's [L, E]) by a scan is read in place, with no slice op before the kernel and no staging of
the whole stack (given the stack itself, XLA may copy all of it into VMEM before each call when it fits).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._vendor.rms_formula import forward as rms_forward
from .._vendor.tiling import cdiv

LANES = 128


@dataclasses.dataclass(frozen=True)
class RouteStatic:
    top_k: int
    block_tokens: int
    interpret: object = False
    norm: bool = False  # x is RMS-normalised (by a norm weight) before the router, the normalised x an output
    residual: bool = False  # a residual stream is added to x before the norm, the sum an output
    scaled: bool = False  # the weights are multiplied by a per-expert scale at their ids
    eps: float = 1e-6


def top_k_softmax(logits: jax.Array, k: int, scale: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(ids [T, LANES] int32, weights [T, LANES] f32), the first k lanes holding the top k of logits [T, E] (first
    index on ties) and the softmax over those k (times scale [1, E] f32 at each id when given): the arithmetic both
    the kernel and the XLA path run. A NaN row keeps NaN weights (and ids clamped into range), so it cannot pass as a
    routing."""
    t, e = logits.shape
    col = jax.lax.broadcasted_iota(jnp.int32, (t, e), 1)
    lane = jax.lax.broadcasted_iota(jnp.int32, (t, LANES), 1)
    ids = jnp.zeros((t, LANES), jnp.int32)
    top = jnp.full((t, LANES), -jnp.inf, jnp.float32)
    factor = jnp.ones((t, LANES), jnp.float32)
    cur = logits
    for j in range(k):
        best = jnp.max(cur, axis=1, keepdims=True)
        idx = jnp.minimum(jnp.min(jnp.where(cur == best, col, e), axis=1, keepdims=True), e - 1)
        ids = jnp.where(lane == j, idx, ids)
        top = jnp.where(lane == j, best, top)
        if scale is not None:  # the scale at the picked expert: a masked lane sum (no gather in a kernel)
            picked = jnp.sum(jnp.where(col == idx, scale, 0.0), axis=1, keepdims=True)
            factor = jnp.where(lane == j, picked, factor)
        cur = jnp.where(col == idx, -jnp.inf, cur)
    first = jnp.max(jnp.where(lane == 0, top, -jnp.inf), axis=1, keepdims=True)
    p = jnp.where(lane < k, jnp.exp(top - first), 0.0)
    return ids, p / jnp.sum(p, axis=1, keepdims=True) * factor


def normed_input(st: RouteStatic, x: jax.Array, residual: jax.Array | None, norm_w: jax.Array | None
                 ) -> tuple[jax.Array, jax.Array]:
    """(what the router reads, the residual stream): x, or x + residual rounded to x's dtype, RMS-normalised by
    norm_w [1, H] (float32 arithmetic, out in x's dtype) when the call has a norm: the arithmetic both the kernel
    and the XLA path run."""
    total = x
    if st.residual:
        total = (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)
    return (rms_forward(total, norm_w, eps=st.eps) if st.norm else total), total


def _kernel(*refs, st: RouteStatic):
    refs = list(refs)
    x_ref, w_ref = refs.pop(0), refs.pop(0)
    nw_ref = refs.pop(0) if st.norm else None
    r_ref = refs.pop(0) if st.residual else None
    sc_ref = refs.pop(0) if st.scaled else None
    ids_ref, wts_ref = refs.pop(0), refs.pop(0)
    y_ref = refs.pop(0) if st.norm else None
    s_ref = refs.pop(0) if st.residual else None
    y, total = normed_input(st, x_ref[...], None if r_ref is None else r_ref[...],
                            None if nw_ref is None else nw_ref[...])
    if y_ref is not None:
        y_ref[...] = y
    if s_ref is not None:
        s_ref[...] = total
    logits = jax.lax.dot_general(y, w_ref[...], (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    ids, wts = top_k_softmax(logits, st.top_k, None if sc_ref is None else sc_ref[...].astype(jnp.float32))
    ids_ref[...] = ids[:, :st.top_k]
    wts_ref[...] = wts[:, :st.top_k]


def route_forward(st: RouteStatic, x: jax.Array, w: jax.Array, norm_w: jax.Array | None = None,
                  residual: jax.Array | None = None, scale: jax.Array | None = None) -> tuple[jax.Array, ...]:
    """(ids [T, k] int32, weights [T, k] f32), then the normalised x [T, H] when st.norm and x + residual when
    st.residual, for x [T, H], one layer's router w [H, E], its norm's weight norm_w [1, H] and per-expert scale
    [1, E]."""
    t, h = x.shape
    e, bt = w.shape[-1], st.block_tokens
    rows = lambda cols: pl.BlockSpec((bt, cols), lambda i: (i, 0))
    whole = lambda a: pl.BlockSpec(a.shape, lambda i: (0, 0))
    args = [x, w] + [norm_w] * st.norm + [residual] * st.residual + [scale] * st.scaled
    in_specs = ([rows(h), whole(w)] + ([whole(norm_w)] if st.norm else []) + [rows(h)] * st.residual
                + ([whole(scale)] if st.scaled else []))
    fused = [False, True] + [True] * st.norm + [False] * st.residual + [True] * st.scaled
    out_specs = [rows(st.top_k), rows(st.top_k)] + [rows(h)] * (st.norm + st.residual)
    out_shape = ([jax.ShapeDtypeStruct((t, st.top_k), jnp.int32), jax.ShapeDtypeStruct((t, st.top_k), jnp.float32)]
                 + [jax.ShapeDtypeStruct((t, h), x.dtype)] * (st.norm + st.residual))
    moved = (1 + 2 * st.residual + st.norm) * t * h * x.dtype.itemsize + sum(a.size * a.dtype.itemsize
                                                                              for a in args[1:] if a is not residual)
    cost = pl.CostEstimate(flops=2 * t * h * e + 4 * st.top_k * t * e + 6 * t * h * st.norm,
                           transcendentals=t * (st.top_k + st.norm), bytes_accessed=moved + 8 * t * st.top_k)
    return tuple(pl.pallas_call(
        functools.partial(_kernel, st=st),
        grid=(cdiv(t, bt),),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",), allow_input_fusion=fused),
        cost_estimate=cost,
        interpret=st.interpret,
        name="moe_route",
    )(*args))
