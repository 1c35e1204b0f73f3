"""The Pallas RMSNorm kernels for TPU: forward, and a backward giving dx and per-block partial sums of dw.

x is seen as [R, H] (leading axes flattened). Grid: one step per block of rows, each block the whole hidden axis, so
the reduction never crosses steps and every step is independent ("parallel": megacore chips split them). The last
block may run past R: its out-of-range rows are computed on whatever the buffer holds and their writes are dropped by
Pallas; in the backward they are masked out of the dw partial sum (a `where`, so NaN garbage cannot leak in). dw is
summed over the blocks' partials outside the kernel (nblocks x H floats), which keeps the grid parallel.
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
from .stacked import select_row, stack_spec


@dataclasses.dataclass(frozen=True)
class RMSStatic:
    eps: float
    zero_centered: bool
    scale_after_cast: bool
    block_rows: int
    interpret: object = False


def _params() -> pltpu.CompilerParams:
    return pltpu.CompilerParams(dimension_semantics=("parallel",))


def _forward_kernel(x_ref, w_ref, o_ref, *, st: RMSStatic):
    o_ref[...] = formula.forward(x_ref[...], w_ref[...], eps=st.eps, zero_centered=st.zero_centered,
                                 scale_after_cast=st.scale_after_cast)


def _forward_stacked_kernel(l_ref, x_ref, w_ref, o_ref, *, st: RMSStatic, layers: int):
    w = select_row(w_ref[...], l_ref[0], layers)
    o_ref[...] = formula.forward(x_ref[...], w, eps=st.eps, zero_centered=st.zero_centered,
                                 scale_after_cast=st.scale_after_cast)


def _add_kernel(l_ref, x_ref, r_ref, w_ref, *refs, st: RMSStatic, layers: int):
    """(norm of s, s), s = x + residual; with an x weight stack (refs = wx, y, s) x is normalised by it first."""
    wx_ref, y_ref, s_ref = refs if len(refs) == 3 else (None, *refs)
    norm = lambda a, w_ref: formula.forward(a, select_row(w_ref[...], l_ref[0], layers), eps=st.eps,
                                            zero_centered=st.zero_centered, scale_after_cast=st.scale_after_cast)
    x = x_ref[...] if wx_ref is None else norm(x_ref[...], wx_ref)
    total = (x.astype(jnp.float32) + r_ref[...].astype(jnp.float32)).astype(s_ref.dtype)
    s_ref[...] = total
    y_ref[...] = norm(total, w_ref)


def _backward_kernel(x_ref, w_ref, dy_ref, dx_ref, dw_ref, *, st: RMSStatic, rows: int):
    dx, contrib = formula.backward(x_ref[...], w_ref[...], dy_ref[...], eps=st.eps, zero_centered=st.zero_centered)
    dx_ref[...] = dx.astype(dx_ref.dtype)
    row = pl.program_id(0) * st.block_rows + jax.lax.broadcasted_iota(jnp.int32, contrib.shape, 0)
    contrib = jnp.where(row < rows, contrib, 0.0)
    dw_ref[...] = jnp.sum(contrib, axis=0, keepdims=True).reshape(dw_ref.shape)


def _specs(r: int, h: int, br: int):
    rows = pl.BlockSpec((br, h), lambda i: (i, 0))
    weight = pl.BlockSpec((1, h), lambda i: (0, 0))
    return rows, weight


def rms_forward(st: RMSStatic, x: jax.Array, w: jax.Array) -> jax.Array:
    """y [R, H] in x's dtype for x [R, H], w [H]."""
    r, h = x.shape
    rows, weight = _specs(r, h, st.block_rows)
    itemsize = jnp.dtype(x.dtype).itemsize
    cost = pl.CostEstimate(flops=5 * r * h, transcendentals=r,
                           bytes_accessed=2 * r * h * itemsize + h * jnp.dtype(w.dtype).itemsize)
    return pl.pallas_call(
        functools.partial(_forward_kernel, st=st),
        grid=(cdiv(r, st.block_rows),),
        in_specs=[rows, weight],
        out_specs=rows,
        out_shape=jax.ShapeDtypeStruct((r, h), x.dtype),
        compiler_params=_params(),
        cost_estimate=cost,
        interpret=st.interpret,
        name="rms_norm_fwd",
    )(x, w.reshape(1, h))


def _stacked_rows_call(kernel, name: str, st: RMSStatic, row_inputs: tuple[jax.Array, ...], outputs: int,
                       w_stack: jax.Array, layer: jax.Array, flops_per_element: int, more_stacks: tuple = ()):
    """A pallas_call over blocks of rows of [R, H] arrays (`row_inputs`, then `outputs` of x's shape and dtype)
    reading row `layer` (an int32 0-d array in range) of w_stack [L, H] (and of each of more_stacks) in the kernel:
    the stack's block holding it, scalar-prefetched by layer, so no slice is taken outside."""
    x = row_inputs[0]
    r, h = x.shape
    br, layers = st.block_rows, w_stack.shape[0]
    stacks = (w_stack, *more_stacks)
    rows = pl.BlockSpec((br, h), lambda i, l_ref: (i, 0))
    moved = (len(row_inputs) + outputs) * r * h * jnp.dtype(x.dtype).itemsize
    cost = pl.CostEstimate(flops=flops_per_element * r * h, transcendentals=r,
                           bytes_accessed=moved + 16 * h * len(stacks) * jnp.dtype(w_stack.dtype).itemsize)
    out = jax.ShapeDtypeStruct((r, h), x.dtype)
    return pl.pallas_call(
        functools.partial(kernel, st=st, layers=layers),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(cdiv(r, br),),
            in_specs=[rows] * len(row_inputs) + [stack_spec(layers, h)] * len(stacks),
            out_specs=rows if outputs == 1 else [rows] * outputs),
        out_shape=out if outputs == 1 else [out] * outputs,
        compiler_params=_params(),
        cost_estimate=cost,
        interpret=st.interpret,
        name=name,
    )(layer.reshape(1), *row_inputs, *stacks)


def rms_forward_stacked(st: RMSStatic, x: jax.Array, w_stack: jax.Array, layer: jax.Array) -> jax.Array:
    """y [R, H] in x's dtype for x [R, H] and the weight row `layer` of w_stack [L, H], read in the kernel."""
    return _stacked_rows_call(_forward_stacked_kernel, "rms_norm_fwd", st, (x,), 1, w_stack, layer, 5)


def rms_add_forward(st: RMSStatic, x: jax.Array, residual: jax.Array, w_stack: jax.Array, layer: jax.Array,
                    wx_stack: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(y, s) [R, H] in x's dtype: s = x + residual (rounded to x's dtype, as the residual stream is), y its RMSNorm
    with row `layer` of w_stack [L, H]: the residual add and the norm after it in one pass over the rows. With
    wx_stack, x is first normalised by its row `layer` (a sandwich norm's post-norm before the add)."""
    more = () if wx_stack is None else (wx_stack,)
    return tuple(_stacked_rows_call(_add_kernel, "rms_norm_add", st, (x, residual), 2, w_stack, layer,
                                    6 + 5 * len(more), more))


def rms_backward(st: RMSStatic, x: jax.Array, w: jax.Array, dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(dx [R, H] in x's dtype, dw [H] float32) for the cotangent dy [R, H]."""
    r, h = x.shape
    rows, weight = _specs(r, h, st.block_rows)
    nb = cdiv(r, st.block_rows)
    itemsize = jnp.dtype(x.dtype).itemsize
    cost = pl.CostEstimate(flops=12 * r * h, transcendentals=r,
                           bytes_accessed=3 * r * h * itemsize + (nb + 1) * h * 4)
    dx, partial = pl.pallas_call(
        functools.partial(_backward_kernel, st=st, rows=r),
        grid=(nb,),
        in_specs=[rows, weight, rows],
        out_specs=[rows, pl.BlockSpec((1, 1, h), lambda i: (i, 0, 0))],
        out_shape=[jax.ShapeDtypeStruct((r, h), x.dtype), jax.ShapeDtypeStruct((nb, 1, h), jnp.float32)],
        compiler_params=_params(),
        cost_estimate=cost,
        interpret=st.interpret,
        name="rms_norm_bwd",
    )(x, w.reshape(1, h), dy.astype(x.dtype))
    return dx, jnp.sum(partial, axis=(0, 1))
