"""The Pallas kernel of `qk_norm_rope`: a fused q/k/v projection's output in, the attention's q, k and v out.

qkv is read as the projection wrote it, [T, heads x D] (heads packed on the lanes, each head a lane-aligned slice
when D is a multiple of 128), and q, k, v are written as the attention kernels read them, [T, heads, D]: the relayout
between the two happens in VMEM, so neither side needs an XLA copy. Grid: one step per block of rows, every step
independent ("parallel"); the last block may run past T, whose rows are computed on whatever the buffer holds and
whose writes Pallas drops.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ._vendor.tiling import cdiv
from .rope import norm_rope_head, unit_norm
from .stacked import select_row, stack_spec


@dataclasses.dataclass(frozen=True)
class QKRopeStatic:
    q_heads: int
    kv_heads: int
    head_dim: int
    half: int  # rotary_dims // 2
    eps: float
    values: str  # "raw" | "normed"
    keys_are_values: bool
    block_rows: int
    interpret: object = False


def _lane_roll(x: jax.Array, shift: int) -> jax.Array:
    return pltpu.roll(x, shift, x.ndim - 1)


def _kernel(l_ref, qkv_ref, cos_ref, sin_ref, qw_ref, kw_ref, q_ref, k_ref, v_ref, *, st: QKRopeStatic, layers: int):
    d = st.head_dim
    cos, sin = cos_ref[...], sin_ref[...]
    qw, kw = (select_row(ref[...], l_ref[0], layers) for ref in (qw_ref, kw_ref))

    def head(i: int) -> jax.Array:
        return qkv_ref[:, i * d:(i + 1) * d]

    rotate = functools.partial(norm_rope_head, cos=cos, sin=sin, eps=st.eps, half=st.half, roll=_lane_roll)
    for h in range(st.q_heads):
        q_ref[:, h, :] = rotate(head(h), qw).astype(q_ref.dtype)
    for h in range(st.kv_heads):
        raw = head(st.q_heads + h)
        k_ref[:, h, :] = rotate(raw, kw).astype(k_ref.dtype)
        src = raw if st.keys_are_values else head(st.q_heads + st.kv_heads + h)
        v_ref[:, h, :] = (unit_norm(src, st.eps) if st.values == "normed" else src).astype(v_ref.dtype)


def qk_rope_forward(st: QKRopeStatic, qkv: jax.Array, q_weight: jax.Array, k_weight: jax.Array, cos: jax.Array,
                    sin: jax.Array, layer: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D]) in qkv's dtype for qkv [T, heads x D]; the norms' weights are
    rows `layer` (an int32 0-d array in range) of the stacks q_weight, k_weight [L, D], read in the kernel."""
    t, width = qkv.shape
    d, br, layers = st.head_dim, st.block_rows, q_weight.shape[0]
    rows = lambda cols: pl.BlockSpec((br, cols), lambda i, l_ref: (i, 0))
    heads = lambda n: pl.BlockSpec((br, n, d), lambda i, l_ref: (i, 0, 0))
    weight = stack_spec(layers, d)
    itemsize = jnp.dtype(qkv.dtype).itemsize
    out_heads = st.q_heads + 2 * st.kv_heads
    cost = pl.CostEstimate(flops=12 * t * out_heads * d, transcendentals=t * out_heads,
                           bytes_accessed=(t * width + t * out_heads * d) * itemsize + 2 * t * d * 4)
    return pl.pallas_call(
        functools.partial(_kernel, st=st, layers=layers),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(cdiv(t, br),), in_specs=[rows(width), rows(d), rows(d), weight, weight],
            out_specs=[heads(st.q_heads), heads(st.kv_heads), heads(st.kv_heads)]),
        out_shape=[jax.ShapeDtypeStruct((t, st.q_heads, d), qkv.dtype),
                   jax.ShapeDtypeStruct((t, st.kv_heads, d), qkv.dtype),
                   jax.ShapeDtypeStruct((t, st.kv_heads, d), qkv.dtype)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        cost_estimate=cost,
        interpret=st.interpret,
        name="qk_norm_rope",
    )(layer.reshape(1), qkv, cos.astype(jnp.float32), sin.astype(jnp.float32), q_weight, k_weight)
