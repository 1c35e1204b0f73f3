"""Pallas TPU (Mosaic) kernels: grouped matmul (gmm) and transposed grouped matmul (tgmm).

Both walk the work items of metadata.py; the item arrays are scalar-prefetched into SMEM so the block
index maps can read them. Inputs must already be padded to whole tiles (api.py pads).

gmm   grid (n tiles, items, k tiles):  out[tile] = where(row in group, lhs[tile] @ rhs[group], out[tile])
      Its items axis is bounded by the routing (a dynamic grid bound): only items with rows, plus one per m-tile
      without any, run (metadata.forward_items).
      An output tile stays resident while consecutive items share it; it is zeroed on its first visit,
      so rows past sum(group_sizes) and padding rows come out as zeros, never as uninitialised memory.
tgmm  grid (k tiles, n tiles, items):  out[group] = sum over the group's tiles of lhsT[:, rows] @ dout[rows]
      The f32 accumulator is zeroed on a group's first item and stored on its last, so empty groups get
      zeros. lhs comes in transposed ([K, M]) so both kernels only issue plain and NT matmuls.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .config import RaggedDotConfig, lane_tiles, usable_vmem
from .metadata import GroupMetadata, forward_items

_NUM_PREFETCH = len(GroupMetadata._fields)


def _precision(*dtypes: jnp.dtype) -> jax.lax.Precision | None:
    return jax.lax.Precision.HIGHEST if any(jnp.dtype(d) == jnp.float32 for d in dtypes) else None


def _compiler_params(cfg: RaggedDotConfig, semantics: tuple[str, ...]) -> pltpu.CompilerParams:
    return pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=cfg.vmem_limit_bytes)


def _gmm_kernel(
    tile_ref, group_ref, fetch_tile_ref, fetch_group_ref, lo_ref, hi_ref,  # scalar prefetch (SMEM)
    lhs_ref, rhs_ref,  # inputs (VMEM blocks)
    out_ref,  # output block
    acc_ref,  # f32 scratch
    *, tm: int, transpose_rhs: bool, precision: jax.lax.Precision | None,
) -> None:
    del group_ref, fetch_tile_ref, fetch_group_ref
    i, k = pl.program_id(1), pl.program_id(2)
    last_k = pl.num_programs(2) - 1
    tile = tile_ref[i]
    lo, hi = lo_ref[i], hi_ref[i]
    first_visit = jnp.logical_or(i == 0, tile != tile_ref[jnp.maximum(i - 1, 0)])

    @pl.when(jnp.logical_and(k == 0, first_visit))
    def _zero_out():
        out_ref[...] = jnp.zeros_like(out_ref)

    @pl.when(lo < hi)
    def _work():
        @pl.when(k == 0)
        def _zero_acc():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        contract = (1,) if transpose_rhs else (0,)
        acc_ref[...] += jax.lax.dot_general(
            lhs_ref[...],
            rhs_ref[...],
            (((1,), contract), ((), ())),
            precision=precision,
            preferred_element_type=jnp.float32,
        )

        @pl.when(k == last_k)
        def _store():
            rows = tile * tm + jax.lax.broadcasted_iota(jnp.int32, acc_ref.shape, 0)
            mine = jnp.logical_and(rows >= lo, rows < hi)
            out_ref[...] = jnp.where(mine, acc_ref[...], out_ref[...].astype(jnp.float32)).astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("cfg", "out_dtype", "transpose_rhs", "interpret"))
def gmm(
    lhs: jax.Array,
    rhs: jax.Array,
    meta: GroupMetadata,
    *,
    cfg: RaggedDotConfig,
    out_dtype: jnp.dtype,
    transpose_rhs: bool = False,
    interpret: object = False,
) -> jax.Array:
    """lhs [Mp, Kp] x rhs [G, Kp, Np] ([G, Np, Kp] if transpose_rhs) -> [Mp, Np]; all dims whole tiles."""
    tm, tk, tn = cfg.tm, cfg.tk, cfg.tn
    mp, kp = lhs.shape
    np_ = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    if mp % tm or kp % tk or np_ % tn:
        raise ValueError(f"gmm operands must be whole tiles: (M,K,N)=({mp},{kp},{np_}) tiles {tm, tk, tn}")
    # the items axis runs only the items the forward needs (metadata.forward_items): a bound from the routing
    meta, num_items = forward_items(meta, mp // tm)
    grid = (np_ // tn, num_items, kp // tk)

    def lhs_map(n, i, k, tile, group, fetch_tile, fetch_group, lo, hi):
        return fetch_tile[i], k

    def rhs_map(n, i, k, tile, group, fetch_tile, fetch_group, lo, hi):
        return (fetch_group[i], n, k) if transpose_rhs else (fetch_group[i], k, n)

    def out_map(n, i, k, tile, group, fetch_tile, fetch_group, lo, hi):
        return tile[i], n

    rhs_block = (None, tn, tk) if transpose_rhs else (None, tk, tn)
    kernel = functools.partial(
        _gmm_kernel, tm=tm, transpose_rhs=transpose_rhs, precision=_precision(lhs.dtype, rhs.dtype)
    )
    itemsize = lhs.dtype.itemsize
    cost = pl.CostEstimate(
        flops=2 * mp * kp * np_,
        bytes_accessed=lhs.size * itemsize * (np_ // tn) + rhs.size * rhs.dtype.itemsize
        + mp * np_ * jnp.dtype(out_dtype).itemsize,
        transcendentals=0,
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((mp, np_), out_dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=_NUM_PREFETCH,
            grid=grid,
            in_specs=[pl.BlockSpec((tm, tk), lhs_map), pl.BlockSpec(rhs_block, rhs_map)],
            out_specs=pl.BlockSpec((tm, tn), out_map),
            scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
        ),
        compiler_params=_compiler_params(cfg, ("parallel", "arbitrary", "arbitrary")),
        interpret=interpret,
        cost_estimate=cost,
    )(*meta, lhs, rhs)


def tgmm_tiles(cfg: RaggedDotConfig, kp: int, np_: int, in_itemsize: int, out_itemsize: int) -> tuple[int, int]:
    """(tk, tn) for tgmm: its output block [tk, tn] plus an f32 accumulator of that size must fit VMEM too,
    which the forward's (possibly whole-matrix) tiles may not: the largest tiles dividing the forward's
    that do, larger tk first."""
    budget = usable_vmem(max(in_itemsize, out_itemsize))

    def vmem(tk: int, tn: int) -> int:
        return 2 * (tk * cfg.tm + cfg.tm * tn) * in_itemsize + 2 * tk * tn * out_itemsize + 4 * tk * tn

    fits = [(tk * tn, tk, tn) for tk in lane_tiles(cfg.tk) for tn in lane_tiles(cfg.tn) if vmem(tk, tn) <= budget]
    return (max(fits)[1], max(fits)[2]) if fits else (min(lane_tiles(cfg.tk)), min(lane_tiles(cfg.tn)))


def _tgmm_kernel(
    tile_ref, group_ref, fetch_tile_ref, fetch_group_ref, lo_ref, hi_ref,
    lhs_t_ref, dout_ref,
    out_ref,
    acc_ref,
    *, tm: int, precision: jax.lax.Precision | None,
) -> None:
    del fetch_tile_ref, fetch_group_ref
    i = pl.program_id(2)
    last = pl.num_programs(2) - 1
    group = group_ref[i]
    lo, hi = lo_ref[i], hi_ref[i]
    first = jnp.logical_or(i == 0, group != group_ref[jnp.maximum(i - 1, 0)])
    final = jnp.logical_or(i == last, group != group_ref[jnp.minimum(i + 1, last)])

    @pl.when(first)
    def _zero_acc():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(lo < hi)
    def _work():
        base = tile_ref[i] * tm
        cols = base + jax.lax.broadcasted_iota(jnp.int32, lhs_t_ref.shape, 1)
        rows = base + jax.lax.broadcasted_iota(jnp.int32, dout_ref.shape, 0)
        x = jnp.where(jnp.logical_and(cols >= lo, cols < hi), lhs_t_ref[...], 0)
        d = jnp.where(jnp.logical_and(rows >= lo, rows < hi), dout_ref[...], 0)
        acc_ref[...] += jax.lax.dot_general(
            x.astype(lhs_t_ref.dtype),
            d.astype(dout_ref.dtype),
            (((1,), (0,)), ((), ())),
            precision=precision,
            preferred_element_type=jnp.float32,
        )

    @pl.when(final)
    def _store():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("num_groups", "cfg", "out_dtype", "interpret"))
def tgmm(
    lhs_t: jax.Array,
    dout: jax.Array,
    meta: GroupMetadata,
    *,
    num_groups: int,
    cfg: RaggedDotConfig,
    out_dtype: jnp.dtype,
    interpret: object = False,
) -> jax.Array:
    """lhs_t [Kp, Mp], dout [Mp, Np] -> [G, Kp, Np]: per group, lhs_g.T @ dout_g."""
    tm = cfg.tm
    kp, mp = lhs_t.shape
    np_ = dout.shape[1]
    if mp % tm or kp % cfg.tk or np_ % cfg.tn:
        raise ValueError(f"tgmm operands must be whole tiles: (M,K,N)=({mp},{kp},{np_}) tiles {cfg.tm, cfg.tk, cfg.tn}")
    tk, tn = tgmm_tiles(cfg, kp, np_, lhs_t.dtype.itemsize, jnp.dtype(out_dtype).itemsize)
    grid = (kp // tk, np_ // tn, meta.num_items)

    def lhs_map(k, n, i, tile, group, fetch_tile, fetch_group, lo, hi):
        return k, fetch_tile[i]

    def dout_map(k, n, i, tile, group, fetch_tile, fetch_group, lo, hi):
        return fetch_tile[i], n

    def out_map(k, n, i, tile, group, fetch_tile, fetch_group, lo, hi):
        return group[i], k, n

    kernel = functools.partial(_tgmm_kernel, tm=tm, precision=_precision(lhs_t.dtype, dout.dtype))
    cost = pl.CostEstimate(
        flops=2 * mp * kp * np_,
        bytes_accessed=lhs_t.size * lhs_t.dtype.itemsize * grid[1] + dout.size * dout.dtype.itemsize * grid[0]
        + num_groups * kp * np_ * jnp.dtype(out_dtype).itemsize,
        transcendentals=0,
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_groups, kp, np_), out_dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=_NUM_PREFETCH,
            grid=grid,
            in_specs=[pl.BlockSpec((tk, tm), lhs_map), pl.BlockSpec((tm, tn), dout_map)],
            out_specs=pl.BlockSpec((None, tk, tn), out_map),
            scratch_shapes=[pltpu.VMEM((tk, tn), jnp.float32)],
        ),
        compiler_params=_compiler_params(cfg, ("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        cost_estimate=cost,
    )(*meta, lhs_t, dout)
