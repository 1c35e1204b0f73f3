"""The Pallas kernel of `attention_front`: the residual add, the input RMSNorm, the fused q/k/v projection and the
q/k norms with the rotary embedding, in one call.

Grid (row blocks, heads): the first step of a row block adds the residual (written out once as the new residual
stream), normalises the rows into a VMEM scratch, and every step multiplies them by one head's columns of the
projection, D wide, on the MXU, then norms and rotates that head (or passes the value head through) and writes it
where the attention reads it, [T, heads, D]. The projection's columns stream one head per step, so their DMA runs
under the previous head's work, and no [T, heads x D] intermediate ever reaches HBM. The heads axis carries the
scratch, so it is "arbitrary"; row blocks are independent ("parallel").

The outputs' blocks hold every head of their row block and stay put along the heads axis, so each is written back
once, after the row block's last step; a step stores its head at a static index (one branch per head). Every weight
is a stack over layers read at the scalar-prefetched layer: the norms' [L, H] / [L, D] by their 16-row blocks
(stacked.py); the projection's [L, H, heads x D] as the layer's slice fused into the call (front_forward says why).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from . import formula
from ._vendor.tiling import cdiv
from .pallas_qk_rope import QKRopeStatic, _lane_roll
from .rope import norm_rope_head, unit_norm
from .stacked import select_row, stack_spec


@dataclasses.dataclass(frozen=True)
class FrontStatic:
    rope: QKRopeStatic  # the heads, the q/k norms' eps, the rotary and the value mode; its block_rows, interpret
    zero_centered: bool  # the input norm's form and cast order (formula.forward)
    scale_after_cast: bool
    residual: bool  # a residual stream is added before the norm (and the sum is an output)


def project(xn: jax.Array, w: jax.Array) -> jax.Array:
    """xn [T, H] @ w [H, N] accumulated in float32 and rounded to xn's dtype, as a projection's output is stored
    (f32 operands at HIGHEST precision): the arithmetic both the kernel and the XLA path run."""
    precision = jax.lax.Precision.HIGHEST if xn.dtype == jnp.float32 else None
    y = jax.lax.dot_general(xn, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32,
                            precision=precision)
    return y.astype(xn.dtype)


def _kernel(l_ref, *refs, st: FrontStatic, layers: int):
    if st.residual:
        x_ref, r_ref, nw_ref, w_ref, cos_ref, sin_ref, qw_ref, kw_ref, q_ref, k_ref, v_ref, s_ref, xn_ref = refs
    else:
        x_ref, nw_ref, w_ref, cos_ref, sin_ref, qw_ref, kw_ref, q_ref, k_ref, v_ref, xn_ref = refs
        r_ref = s_ref = None
    rq, layer, j = st.rope, l_ref[0], pl.program_id(1)

    @pl.when(j == 0)
    def _normalise():
        x = x_ref[...]
        if r_ref is not None:
            x = (x.astype(jnp.float32) + r_ref[...].astype(jnp.float32)).astype(s_ref.dtype)
            s_ref[...] = x
        xn_ref[...] = formula.forward(x, select_row(nw_ref[...], layer, layers), eps=rq.eps,
                                      zero_centered=st.zero_centered, scale_after_cast=st.scale_after_cast)

    head = project(xn_ref[...], w_ref[...])
    rotate = functools.partial(norm_rope_head, cos=cos_ref[...], sin=sin_ref[...], eps=rq.eps, half=rq.half,
                               roll=_lane_roll)
    value = lambda src: (unit_norm(src, rq.eps) if rq.values == "normed" else src).astype(v_ref.dtype)
    nq, nkv = rq.q_heads, rq.kv_heads
    # one branch per head: each stores at a static head index (the heads sit on the blocks' sublanes)
    for h in range(nq):
        @pl.when(j == h)
        def _query(h=h):
            q_ref[:, h, :] = rotate(head, select_row(qw_ref[...], layer, layers)).astype(q_ref.dtype)

    for h in range(nkv):
        @pl.when(j == nq + h)
        def _key(h=h):
            k_ref[:, h, :] = rotate(head, select_row(kw_ref[...], layer, layers)).astype(k_ref.dtype)
            if rq.keys_are_values:
                v_ref[:, h, :] = value(head)

        if not rq.keys_are_values:
            @pl.when(j == nq + nkv + h)
            def _value(h=h):
                v_ref[:, h, :] = value(head)


def heads_in(st: QKRopeStatic) -> int:
    """Projected heads: query, key, and value heads unless the values are the keys."""
    return st.q_heads + st.kv_heads * (1 if st.keys_are_values else 2)


def front_forward(st: FrontStatic, x: jax.Array, residual: jax.Array | None, norm_stack: jax.Array,
                  w_stack: jax.Array, q_stack: jax.Array, k_stack: jax.Array, cos: jax.Array, sin: jax.Array,
                  layer: jax.Array) -> tuple[jax.Array, ...]:
    """(q [T, Hq, D], k, v [T, Hkv, D]) in x's dtype, then x + residual when a residual is given, for x [T, H];
    every weight is the row (or matrix) `layer`, an int32 0-d array in range, of its stack: norm_stack [L, H],
    w_stack [L, H, heads x D], q_stack and k_stack [L, D]. The projection's layer is sliced here and the slice fused
    into the kernel's operand (allow_input_fusion): the kernel streams that layer's columns only. Handed the whole
    stack, XLA may stage all of it into VMEM before each call when it fits (libtpu does, for Gemma 4's 29-43 MB
    stacks on v6e at batch 1: every layer's projections read each layer)."""
    rq = st.rope
    t, h = x.shape
    d, br, layers = rq.head_dim, rq.block_rows, norm_stack.shape[0]
    nq, nkv, heads = rq.q_heads, rq.kv_heads, heads_in(rq)
    rows = lambda cols: pl.BlockSpec((br, cols), lambda i, j, l_ref: (i, 0))

    out_heads = lambda n: pl.BlockSpec((br, n, d), lambda i, j, l_ref: (i, 0, 0))
    in_specs = [rows(h)] + ([rows(h)] if st.residual else []) + [
        stack_spec(layers, h), pl.BlockSpec((h, d), lambda i, j, l_ref: (0, j)),
        rows(d), rows(d), stack_spec(layers, d), stack_spec(layers, d)]
    out_specs = [out_heads(nq), out_heads(nkv), out_heads(nkv)]
    out_shape = [jax.ShapeDtypeStruct((t, n, d), x.dtype) for n in (nq, nkv, nkv)]
    if st.residual:
        out_specs.append(rows(h))
        out_shape.append(jax.ShapeDtypeStruct((t, h), x.dtype))
    itemsize = jnp.dtype(x.dtype).itemsize
    moved = ((2 if st.residual else 1) * t * h + h * heads * d + t * heads * d) * itemsize
    cost = pl.CostEstimate(flops=2 * t * h * heads * d + 6 * t * h + 12 * t * heads * d,
                           transcendentals=t * (1 + heads), bytes_accessed=moved + 2 * t * d * 4)
    w = jax.lax.dynamic_index_in_dim(w_stack, layer, keepdims=False)
    args = [x] + ([residual] if st.residual else []) + [norm_stack, w, cos.astype(jnp.float32),
                                                         sin.astype(jnp.float32), q_stack, k_stack]
    # the call's operands: the prefetched layer, then args; only the projection's slice is fused in
    fused = [False] + [a is w for a in args]
    return tuple(pl.pallas_call(
        functools.partial(_kernel, st=st, layers=layers),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(cdiv(t, br), heads), in_specs=in_specs, out_specs=out_specs,
            scratch_shapes=[pltpu.VMEM((br, h), x.dtype)]),
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             allow_input_fusion=fused),
        cost_estimate=cost,
        interpret=rq.interpret,
        name="attention_front",
    )(layer.reshape(1), *args))
