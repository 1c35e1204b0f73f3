"""The Pallas kernel of `moe_route`: router logits, their top k and the softmax over those k, in one call.

x [T, H] and one layer's router weight [H, E] are read into VMEM, the logits are one f32 MXU dot, and the top k are
picked by k rounds over the experts' lanes (the row's maximum, the first expert holding it, that expert masked out),
so ties go to the lower expert as jax.lax.top_k sends them. The ids and weights are assembled on 128 lanes and
stored as [T, k]. Grid: one step per block of tokens, independent ("parallel").

The weight's producer may be fused into the call (allow_input_fusion): a layer sliced out of a stack [L, H, E] by a
scan is read in place, with no slice op before the kernel and no staging of the whole stack (given the stack itself,
XLA may copy all of it into VMEM before each call when it fits).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._vendor.tiling import cdiv

LANES = 128


@dataclasses.dataclass(frozen=True)
class RouteStatic:
    top_k: int
    block_tokens: int
    interpret: object = False


def top_k_softmax(logits: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """(ids [T, LANES] int32, weights [T, LANES] f32), the first k lanes holding the top k of logits [T, E] (first
    index on ties) and the softmax over those k: the arithmetic both the kernel and the XLA path run. A NaN row keeps
    NaN weights (and ids clamped into range), so it cannot pass as a routing."""
    t, e = logits.shape
    col = jax.lax.broadcasted_iota(jnp.int32, (t, e), 1)
    lane = jax.lax.broadcasted_iota(jnp.int32, (t, LANES), 1)
    ids = jnp.zeros((t, LANES), jnp.int32)
    top = jnp.full((t, LANES), -jnp.inf, jnp.float32)
    cur = logits
    for j in range(k):
        best = jnp.max(cur, axis=1, keepdims=True)
        idx = jnp.minimum(jnp.min(jnp.where(cur == best, col, e), axis=1, keepdims=True), e - 1)
        ids = jnp.where(lane == j, idx, ids)
        top = jnp.where(lane == j, best, top)
        cur = jnp.where(col == idx, -jnp.inf, cur)
    first = jnp.max(jnp.where(lane == 0, top, -jnp.inf), axis=1, keepdims=True)
    p = jnp.where(lane < k, jnp.exp(top - first), 0.0)
    return ids, p / jnp.sum(p, axis=1, keepdims=True)


def _kernel(x_ref, w_ref, ids_ref, wts_ref, *, st: RouteStatic):
    logits = jax.lax.dot_general(x_ref[...], w_ref[...], (((1,), (0,)), ((), ())),
                                 preferred_element_type=jnp.float32)
    ids, wts = top_k_softmax(logits, st.top_k)
    ids_ref[...] = ids[:, :st.top_k]
    wts_ref[...] = wts[:, :st.top_k]


def route_forward(st: RouteStatic, x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(ids [T, k] int32, weights [T, k] f32) for x [T, H] and one layer's router w [H, E]."""
    t, h = x.shape
    e, bt = w.shape[-1], st.block_tokens
    rows = lambda cols: pl.BlockSpec((bt, cols), lambda i: (i, 0))
    cost = pl.CostEstimate(flops=2 * t * h * e + 4 * st.top_k * t * e, transcendentals=t * st.top_k,
                           bytes_accessed=t * h * x.dtype.itemsize + h * e * w.dtype.itemsize + 8 * t * st.top_k)
    return pl.pallas_call(
        functools.partial(_kernel, st=st),
        grid=(cdiv(t, bt),),
        in_specs=[rows(h), pl.BlockSpec((h, e), lambda i: (0, 0))],
        out_specs=[rows(st.top_k), rows(st.top_k)],
        out_shape=[jax.ShapeDtypeStruct((t, st.top_k), jnp.int32), jax.ShapeDtypeStruct((t, st.top_k), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",), allow_input_fusion=[False, True]),
        cost_estimate=cost,
        interpret=st.interpret,
        name="moe_route",
    )(x, w)
