"""Pallas TPU (Mosaic) kernels: grouped matmul (gmm) and transposed grouped matmul (tgmm).

Both walk the work items of metadata.py, scalar-prefetched into SMEM so the block index maps can read them (gmm
gets them packed, metadata.ForwardItems; tgmm as the six arrays). Inputs must already be padded to whole tiles
(api.py pads).

gmm   grid (n tiles, items, k tiles):  out[tile rows of e] = lhs[those rows] @ rhs[e] for each expert e of the
      item's weight block (cfg.experts_per_step consecutive experts, loaded as one block: decode's few rows per
      expert then cost one grid step per several experts). Inside a row tile only the row windows
      (cfg.window rows, one MXU dot each) holding an expert's rows are computed, so a large row tile (few steps)
      does not multiply other experts' rows.
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
from .metadata import ForwardItems, GroupMetadata, block_shift, pack_forward

_NUM_PREFETCH = len(GroupMetadata._fields)  # tgmm's
#: Row windows start on whole sublane tiles (16 rows hold a bf16 vreg tile, two of f32's 8).
_ALIGN = 16


def _precision(*dtypes: jnp.dtype) -> jax.lax.Precision | None:
    return jax.lax.Precision.HIGHEST if any(jnp.dtype(d) == jnp.float32 for d in dtypes) else None


def compiler_params(cfg: RaggedDotConfig, semantics: tuple[str, ...]) -> pltpu.CompilerParams:
    return pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=cfg.vmem_limit_bytes)


def step_state(items_ref, offsets_ref, *, tm: int, shift: int, experts: int) -> tuple[jax.Array, ...]:
    """(k, last_k, base, lo, hi, first_visit, block) of this grid step in a forward kernel (the plain and the
    quantized one): its K step k, the item's row tile starting at row `base`, the tile's rows [lo, hi) its
    weight block owns (lo >= hi: none), whether it is the tile's first item (its output is zeroed then), and the
    weight block (`experts` consecutive groups)."""
    i, k = pl.program_id(1), pl.program_id(2)
    item = items_ref[i]
    tile, block = item >> shift, item & ((1 << shift) - 1)
    first_visit = jnp.logical_or(i == 0, tile != items_ref[jnp.maximum(i - 1, 0)] >> shift)
    base = tile * tm
    lo = jnp.maximum(offsets_ref[block * experts], base)
    hi = jnp.minimum(offsets_ref[(block + 1) * experts], base + tm)
    return k, pl.num_programs(2) - 1, base, lo, hi, first_visit, block


def expert_rows(j: int, experts: int, lo: jax.Array, hi: jax.Array, block: jax.Array, offsets_ref
                ) -> tuple[jax.Array, jax.Array]:
    """[r0, r1): the rows of the step's weight block's expert j within the item's rows [lo, hi)."""
    if experts == 1:
        return lo, hi
    e = block * experts + j
    return jnp.maximum(lo, offsets_ref[e]), jnp.minimum(hi, offsets_ref[e + 1])


def row_windows(r0: jax.Array, r1: jax.Array, body, *, base: jax.Array, tm: int, window: int, width: int) -> None:
    """body(start, mine) on row windows of the tile at `base` covering [r0, r1): the first starts at r0 rounded down
    to a whole sublane tile (16 rows), the rest follow it, the last moved back to end inside the tile; `mine` marks
    the rows of [r0, r1) a window computes first (an overlap with the previous window is not counted twice)."""
    first = (r0 - base) // _ALIGN * _ALIGN

    def step(w, carry):
        fresh = base + first + w * window  # rows before this were the previous windows'
        start = pl.multiple_of(jnp.minimum(first + w * window, tm - window), _ALIGN)
        rows = base + start + jax.lax.broadcasted_iota(jnp.int32, (window, width), 0)
        body(start, jnp.logical_and(rows >= jnp.maximum(r0, fresh), rows < r1))
        return carry

    jax.lax.fori_loop(0, (r1 - base - first + window - 1) // window, step, 0)


def _gmm_kernel(
    items_ref, fetch_ref, offsets_ref,  # scalar prefetch (metadata.ForwardItems)
    lhs_ref, rhs_ref,  # inputs (VMEM blocks)
    out_ref,  # output block
    *acc,  # f32 accumulator, only when K takes several steps
    tm: int, shift: int, window: int, experts: int, transpose_rhs: bool, precision: jax.lax.Precision | None,
) -> None:
    del fetch_ref
    k, last_k, base, lo, hi, first_visit, block = step_state(items_ref, offsets_ref, tm=tm, shift=shift,
                                                              experts=experts)
    contract = (1,) if transpose_rhs else (0,)

    @pl.when(jnp.logical_and(k == 0, first_visit))
    def _zero():
        out_ref[...] = jnp.zeros_like(out_ref)
        if acc:
            acc[0][...] = jnp.zeros_like(acc[0])

    windows = functools.partial(row_windows, base=base, tm=tm, window=window, width=out_ref.shape[1])

    for j in range(experts):  # the experts of this step's weight block, each on its own rows
        r0, r1 = expert_rows(j, experts, lo, hi, block, offsets_ref)

        @pl.when(r0 < r1)
        def _expert(j=j, r0=r0, r1=r1):
            def dot(start, mine):
                part = jax.lax.dot_general(
                    lhs_ref[pl.ds(start, window), :], rhs_ref[j], (((1,), contract), ((), ())),
                    precision=precision, preferred_element_type=jnp.float32,
                )
                if acc:
                    acc[0][pl.ds(start, window), :] += jnp.where(mine, part, 0.0)
                else:
                    rows = out_ref[pl.ds(start, window), :]
                    out_ref[pl.ds(start, window), :] = jnp.where(mine, part, rows.astype(jnp.float32)).astype(
                        out_ref.dtype)

            windows(r0, r1, dot)

    if acc:
        @pl.when(jnp.logical_and(k == last_k, lo < hi))
        def _store():
            def store(start, mine):
                out_ref[pl.ds(start, window), :] = acc[0][pl.ds(start, window), :].astype(out_ref.dtype)

            windows(lo, hi, store)


def gmm_blocks(group_sizes: jax.Array, experts: int) -> jax.Array:
    """Rows per weight block of `experts` consecutive groups (what the forward's metadata is built on)."""
    g = group_sizes.shape[0]
    return group_sizes if experts == 1 else jnp.maximum(group_sizes, 0).reshape(g // experts, experts).sum(1)


def forward_grid(meta: GroupMetadata, offsets: jax.Array, dims: tuple[int, int, int], g: int, cfg: RaggedDotConfig,
                 name: str) -> tuple[ForwardItems, int, tuple[jax.Array | int, ...]]:
    """A forward's (packed items, their block shift, grid (n tiles, items, k tiles)) for padded (Mp, Kp, Np) `dims`,
    after one clear error when they are not whole tiles or the expert blocks do not divide the groups (the plain and
    the quantized forward)."""
    tm, tk, tn, experts = cfg.tm, cfg.tk, cfg.tn, cfg.experts_per_step
    mp, kp, np_ = dims
    if mp % tm or kp % tk or np_ % tn:
        raise ValueError(f"{name} operands must be whole tiles: (M,K,N)=({mp},{kp},{np_}) tiles {tm, tk, tn}")
    if g % experts:
        raise ValueError(f"experts_per_step={experts} needs a group count it divides (got {g})")
    shift = block_shift(g // experts, mp // tm)
    # the items axis runs only the items the forward needs (metadata.forward_items): a bound from the routing
    items, num_items = pack_forward(meta, offsets, mp // tm, shift)
    return items, shift, (np_ // tn, num_items, kp // tk)


def forward_lhs_map(n, i, k, items, fetch, offsets, *, shift: int):
    """A forward's lhs block: the row tile its item fetches, K step k."""
    return fetch[i] >> shift, k


def forward_out_map(n, i, k, items, fetch, offsets, *, shift: int):
    """A forward's output block: the item's row tile, N tile n."""
    return items[i] >> shift, n


def fetch_block(fetch, i, shift: int) -> jax.Array:
    """The weight block item i loads."""
    return fetch[i] & ((1 << shift) - 1)


def _drop_layer_ref(fn, at: int):
    """fn called without the positional argument at index `at` (the layer's prefetch ref, which only the weight
    index map reads), so the kernel body and the other index maps keep their unstacked signatures. It keeps fn's
    name: the kernel is the same kernel, named the same in a profile or a cost walk."""
    def without(*args, **kwargs):
        return fn(*args[:at], *args[at + 1:], **kwargs)
    named = fn
    while isinstance(named, functools.partial):
        named = named.func
    without.__name__ = without.__qualname__ = getattr(named, "__name__", "without")
    return without


@functools.partial(jax.jit, static_argnames=("cfg", "out_dtype", "transpose_rhs", "interpret"))
def gmm(
    lhs: jax.Array,
    rhs: jax.Array,
    meta: GroupMetadata,
    *,
    offsets: jax.Array,
    cfg: RaggedDotConfig,
    out_dtype: jnp.dtype,
    transpose_rhs: bool = False,
    interpret: object = False,
    layer: jax.Array | None = None,
) -> jax.Array:
    """lhs [Mp, Kp] x rhs [G, Kp, Np] ([G, Np, Kp] if transpose_rhs) -> [Mp, Np]; all dims whole tiles.

    `offsets` ([G + 1], metadata.group_offsets) says which rows each group owns. With cfg.experts_per_step = E > 1,
    `meta` is built on the row counts of blocks of E groups (gmm_blocks).

    With `layer` (an int32 scalar, may be traced) rhs is stacked over layers, [L, G, Kp, Np], and the weight
    blocks are read from rhs[layer] by the index map (the layer is one more scalar-prefetch operand), so no
    slice of the stack is ever copied out."""
    tm, tk, tn = cfg.tm, cfg.tk, cfg.tn
    experts = cfg.experts_per_step
    mp, kp = lhs.shape
    stacked = layer is not None
    weights = rhs.shape[1:] if stacked else rhs.shape
    g = weights[0]
    np_ = weights[1] if transpose_rhs else weights[2]
    items, shift, grid = forward_grid(meta, offsets, (mp, kp, np_), g, cfg, "gmm")

    def rhs_map(n, i, k, items_ref, fetch, offsets_ref, *layer_ref):
        block = fetch_block(fetch, i, shift)
        idx = (block, n, k) if transpose_rhs else (block, k, n)
        return (layer_ref[0][0], *idx) if stacked else idx

    rhs_block = (experts, tn, tk) if transpose_rhs else (experts, tk, tn)
    kernel = functools.partial(
        _gmm_kernel, tm=tm, shift=shift, window=cfg.window, experts=experts, transpose_rhs=transpose_rhs,
        precision=_precision(lhs.dtype, rhs.dtype),
    )
    lhs_map, out_map = (functools.partial(f, shift=shift) for f in (forward_lhs_map, forward_out_map))
    prefetch = tuple(items)
    if stacked:
        rhs_block = (None, *rhs_block)
        at = len(prefetch)  # the layer's ref follows the packed items; index maps get 3 grid ids first
        kernel = _drop_layer_ref(kernel, at)
        lhs_map, out_map = (_drop_layer_ref(f, len(grid) + at) for f in (lhs_map, out_map))
        prefetch = (*prefetch, jnp.reshape(layer, (1,)).astype(jnp.int32))
    itemsize = lhs.dtype.itemsize
    layer_bytes = g * kp * np_ * rhs.dtype.itemsize  # one layer's weights: what the kernel reads
    cost = pl.CostEstimate(
        flops=2 * mp * kp * np_,
        bytes_accessed=lhs.size * itemsize * (np_ // tn) + layer_bytes
        + mp * np_ * jnp.dtype(out_dtype).itemsize,
        transcendentals=0,
    )
    scratch = [pltpu.VMEM((tm, tn), jnp.float32)] if kp // tk > 1 else []
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((mp, np_), out_dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch),
            grid=grid,
            in_specs=[pl.BlockSpec((tm, tk), lhs_map), pl.BlockSpec(rhs_block, rhs_map)],
            out_specs=pl.BlockSpec((tm, tn), out_map),
            scratch_shapes=scratch,
        ),
        compiler_params=compiler_params(cfg, ("parallel", "arbitrary", "arbitrary")),
        interpret=interpret,
        cost_estimate=cost,
    )(*prefetch, lhs, rhs)


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
        compiler_params=compiler_params(cfg, ("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        cost_estimate=cost,
    )(*meta, lhs_t, dout)
