"""The "cpu" path: a grouped matmul that does O(M*K*N) work, unlike jax.lax.ragged_dot on CPU
(which densifies to one dot over all G groups).

Design (capacity + overflow):
  1. Every group's first C rows are gathered into a [G, C, K] block and multiplied by rhs [G, K, N] in one
     batched matmul. rhs is read once, in place (no gather of weights).
  2. Rows beyond C in a group are cut into C-row chunks; a while_loop with a traced trip count multiplies
     each chunk by its group's weights. There are at most floor(M / C) such chunks.
Work is bounded by (G*C + M)*K*N whatever the routing; with C ~ M/G that is about 2x the useful work.
Static shapes throughout, so it jits with traced group sizes. The loop is not reverse-differentiable, so
`grouped_matmul` carries a custom_vjp: d_lhs is a grouped matmul against rhs^T, d_rhs a per-group `tgmm`.
Used by ragged-dot-tpu's "cpu" path and Tokamax ragged dot's "hub_cpu" path.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .groups import group_bounds
from .tiling import round_up


def default_capacity(m: int, g: int) -> int:
    """Rows per group in the batched step: the mean group size plus three standard deviations of
    uniform routing, rounded up to 8, so that balanced routing rarely takes the loop."""
    mean = m / g
    return min(round_up(max(8, math.ceil(mean + 3 * math.sqrt(mean))), 8), round_up(m, 8))


class _Plan(NamedTuple):
    starts: jax.Array  # [G]
    sizes: jax.Array  # [G]
    total: jax.Array  # []
    chunk_group: jax.Array  # [E] group of each overflow chunk
    chunk_start: jax.Array  # [E] first row
    chunk_rows: jax.Array  # [E] rows in it (<= C)
    num_chunks: jax.Array  # [] chunks to run


def _plan(group_sizes: jax.Array, m: int, c: int) -> _Plan:
    starts, ends = group_bounds(group_sizes, m)
    sizes = ends - starts
    extra = jnp.maximum((sizes + c - 1) // c - 1, 0)  # chunks past the first C rows, per group
    e = max(m // c, 1)
    seg = jnp.repeat(jnp.arange(sizes.shape[0], dtype=jnp.int32), extra, total_repeat_length=e)
    i = jnp.arange(e, dtype=jnp.int32)
    j = i - (jnp.cumsum(extra) - extra)[seg] + 1
    chunk_start = starts[seg] + j * c
    chunk_rows = jnp.clip(ends[seg] - chunk_start, 0, c)
    return _Plan(starts, sizes, ends[-1], seg, chunk_start, chunk_rows, jnp.sum(extra))


def _to_bits(x: jax.Array) -> jax.Array:
    """bf16 weights enter loops as uint16: XLA:CPU otherwise widens the whole loop-carried bf16 array to
    f32 before the loop (a full weight copy per call, 3-4x the cost of the matmuls)."""
    return jax.lax.bitcast_convert_type(x, jnp.uint16) if x.dtype == jnp.bfloat16 else x


def _from_bits(x: jax.Array, dtype: jnp.dtype) -> jax.Array:
    return jax.lax.bitcast_convert_type(x, dtype) if x.dtype != dtype else x


def _row_groups(ends: jax.Array, m: int) -> jax.Array:
    """Group of every row (rows past the last group get G-1): count of group ends at or before it."""
    marks = jnp.zeros((m + 1,), jnp.int32).at[ends].add(1)
    return jnp.minimum(jnp.cumsum(marks)[:m], ends.shape[0] - 1)


def _dot(a: jax.Array, b: jax.Array, dims: str) -> jax.Array:
    # HIGHEST only matters for f32 (bf16 products are exact in f32); on bf16 operands it also makes
    # XLA:CPU insert a full f32 copy of the weights.
    exact = a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16
    precision = None if exact else jax.lax.Precision.HIGHEST
    return jnp.einsum(dims, a, b, precision=precision, preferred_element_type=jnp.float32)


def _compute_dtype(*xs: jax.Array) -> jnp.dtype:
    # Keep bf16 operands bf16 and ask the dot for f32 results: XLA:CPU's bf16 x bf16 -> f32 dot runs at
    # f32 speed, while an explicit astype(f32) of the weights writes a full f32 copy every call (3-4x slower).
    return jnp.result_type(*[x.dtype for x in xs])


def gmm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    out_dtype: jnp.dtype,
    transpose_rhs: bool = False,
    capacity: int | None = None,
) -> jax.Array:
    """out[r] = lhs[r] @ rhs[g(r)] (rhs[g(r)].T when transpose_rhs); rows past the groups are zero."""
    m, k = lhs.shape
    g = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    c = capacity or default_capacity(m, g)
    p = _plan(group_sizes, m, c)
    ct = _compute_dtype(lhs, rhs)
    x = jnp.concatenate([lhs.astype(ct), jnp.zeros((c, k), ct)])  # room for a chunk starting near m
    w = rhs.astype(ct)
    rhs_dims = "gnk" if transpose_rhs else "gkn"

    # 1. first C rows of every group, one batched matmul
    slot = jnp.arange(c, dtype=jnp.int32)
    rows = p.starts[:, None] + slot[None, :]
    in_first = slot[None, :] < p.sizes[:, None]
    xg = jnp.where(in_first[..., None], x[jnp.where(in_first, rows, m)], 0)
    y = _dot(xg, w, f"gck,{rhs_dims}->gcn").reshape(g * c, n)

    row = jnp.arange(m, dtype=jnp.int32)
    row_group = _row_groups(p.starts + p.sizes, m)
    pos = row - p.starts[row_group]
    live = row < p.total
    first = jnp.where(((pos < c) & live)[:, None], y[row_group * c + jnp.minimum(pos, c - 1)], 0.0)

    # 2. overflow chunks: a loop with a traced trip count, skipped outright when no group overflows
    def chunk(i: jax.Array, buf: jax.Array, w_bits: jax.Array) -> jax.Array:
        start = p.chunk_start[i]
        xi = jax.lax.dynamic_slice_in_dim(x, start, c)
        wi = _from_bits(jax.lax.dynamic_index_in_dim(w_bits, p.chunk_group[i], keepdims=False), w.dtype)
        yi = _dot(xi, wi, "ck,nk->cn" if transpose_rhs else "ck,kn->cn")
        keep = (jnp.arange(c) < p.chunk_rows[i])[:, None]
        old = jax.lax.dynamic_slice_in_dim(buf, start, c)
        return jax.lax.dynamic_update_slice_in_dim(buf, jnp.where(keep, yi, old), start, 0)

    def overflow(w: jax.Array) -> jax.Array:
        w_bits = _to_bits(w)
        return jax.lax.fori_loop(
            0, p.num_chunks, lambda i, buf: chunk(i, buf, w_bits), jnp.zeros((m + c, n), jnp.float32)
        )

    buf = jax.lax.cond(p.num_chunks > 0, overflow, lambda w: jnp.zeros((m + c, n), jnp.float32), w)
    out = jnp.where(((pos >= c) & live)[:, None], buf[:m], first)
    return out.astype(out_dtype)


def tgmm(
    lhs: jax.Array,
    dout: jax.Array,
    group_sizes: jax.Array,
    *,
    out_dtype: jnp.dtype,
    capacity: int | None = None,
) -> jax.Array:
    """d_rhs[g] = lhs_g.T @ dout_g over the rows of group g: [G, K, N]; empty groups give zeros."""
    m, k = lhs.shape
    n = dout.shape[1]
    g = group_sizes.shape[0]
    c = capacity or default_capacity(m, g)
    p = _plan(group_sizes, m, c)
    ct = _compute_dtype(lhs, dout)
    x = jnp.concatenate([lhs.astype(ct), jnp.zeros((c, k), ct)])
    d = jnp.concatenate([dout.astype(ct), jnp.zeros((c, n), ct)])

    slot = jnp.arange(c, dtype=jnp.int32)
    rows = p.starts[:, None] + slot[None, :]
    in_first = slot[None, :] < p.sizes[:, None]
    idx = jnp.where(in_first, rows, m)
    xg = jnp.where(in_first[..., None], x[idx], 0)
    dg = jnp.where(in_first[..., None], d[idx], 0)
    acc = _dot(xg, dg, "gck,gcn->gkn")

    def body(i: jax.Array, acc: jax.Array) -> jax.Array:
        start, grp = p.chunk_start[i], p.chunk_group[i]
        keep = (jnp.arange(c) < p.chunk_rows[i])[:, None]
        xi = jnp.where(keep, jax.lax.dynamic_slice_in_dim(x, start, c), 0)
        di = jnp.where(keep, jax.lax.dynamic_slice_in_dim(d, start, c), 0)
        upd = jax.lax.dynamic_index_in_dim(acc, grp, keepdims=True) + _dot(xi, di, "ck,cn->kn")[None]
        return jax.lax.dynamic_update_index_in_dim(acc, upd, grp, 0)

    acc = jax.lax.cond(p.num_chunks > 0, lambda a: jax.lax.fori_loop(0, p.num_chunks, body, a), lambda a: a, acc)
    return acc.astype(out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, out_dtype: Any,
                   capacity: int | None = None) -> jax.Array:
    """Differentiable `gmm`: out[r] = lhs[r] @ rhs[g(r)], rows past the groups zero, in `out_dtype`."""
    return gmm(lhs, rhs, group_sizes, out_dtype=out_dtype, capacity=capacity)


def _grouped_matmul_fwd(lhs, rhs, group_sizes, out_dtype, capacity):
    return gmm(lhs, rhs, group_sizes, out_dtype=out_dtype, capacity=capacity), (lhs, rhs, group_sizes)


def _grouped_matmul_bwd(out_dtype, capacity, res, dout):
    del out_dtype
    lhs, rhs, group_sizes = res
    d_lhs = gmm(dout, rhs, group_sizes, out_dtype=lhs.dtype, transpose_rhs=True, capacity=capacity)
    d_rhs = tgmm(lhs, dout, group_sizes, out_dtype=rhs.dtype, capacity=capacity)
    return d_lhs, d_rhs, None


grouped_matmul.defvjp(_grouped_matmul_fwd, _grouped_matmul_bwd)
