"""The Pallas TPU (Mosaic) grouped matmul on quantized weights: int8 with per-(expert, output channel) scales, or
float8_e4m3fn with 128x128 block scales. HBM moves only the quantized bytes (1 byte a weight) and the scales; each
weight block is upcast in VMEM after its DMA.

Same work items, grid and row windows as pallas_gmm.gmm (grid (n tiles, items, k tiles), several experts per step,
only the row windows holding an expert's rows computed). Per expert, the K tile is walked in chunks of `chunk` rows
(128 for block scales: one scale row each; up to 512 for int8): the chunk of weights is cast to the dot's dtype (bf16
for a bf16 lhs, f32 for an f32 lhs; int8 and e4m3 values are exact in bf16, so the cast loses nothing), multiplied
on the MXU with an f32 result, and that partial product is scaled by the chunk's per-column scales before it is
added to the f32 accumulator. Scaling the partial product, not the weights, keeps the dot exact: the result equals
dequantize-then-dot up to f32 summation order.

Why upcast: the MXU takes int8 x int8 (v5e, v6e) and fp8 x fp8 (v7x) only when both operands are quantized; with a
bf16 or f32 activation the weights must meet it in bf16 / f32, and decode is bound by reading the weights, not by
the MXU. Quantizing the activations too (a native int8 / fp8 MXU pass) is not done here.

Scales in the kernel: int8 per-channel `[G, 1, Np]` f32 (block (experts, 1, tn)); fp8 blocks arranged by the wrapper
as `[G, Nt, Kt, tk/128, tn/128]` (tiny: one f32 per 128x128 weights), one block per (expert block, n tile, k tile),
expanded across the tile's columns in VMEM by a 0/1 matrix product (exact at HIGHEST precision).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._vendor.chips import ChipFacts, tile_budget_bytes
from .._vendor.tiling import cdiv, round_up
from .config import (
    STREAM_FRACTION,
    UNKNOWN_CHIP,
    RaggedDotConfig,
    fastest_fitting,
    forward_schedule,
    usable_vmem,
    with_vmem_limit,
)
from .gmm import (
    compiler_params,
    expert_rows,
    fetch_block,
    forward_grid,
    forward_lhs_map,
    forward_out_map,
    row_windows,
    step_state,
)
from .metadata import GroupMetadata

#: Weight rows of one fp8 scale block (and of the transformers fine-grained FP8 layout's blocks, both axes).
BLOCK = 128
_MIB = 1024 * 1024


def chunk_rows(tk: int, block_scales: bool) -> int:
    """Weight rows upcast and multiplied at a time: one scale block (128) for fp8; for int8 the largest of 512, 256,
    128 not above the K tile (a K tile that is no multiple of it ends in a narrower chunk), or the whole tile."""
    if block_scales:
        return min(BLOCK, tk)
    for c in (512, 256, 128):
        if tk >= c:
            return c
    return tk


def quant_vmem_bytes(cfg: RaggedDotConfig, lhs_itemsize: int, out_itemsize: int, block_scales: bool) -> int:
    """Bytes of VMEM one step holds: double-buffered lhs, 1-byte weight and scale blocks and the output block, the
    f32 accumulator, one upcast weight chunk, one window's partial product and the expanded block scales."""
    ck = chunk_rows(cfg.tk, block_scales)
    eb = cfg.experts_per_step
    kb, nb = cdiv(cfg.tk, BLOCK), cdiv(cfg.tn, BLOCK)
    scales = eb * (round_up(kb, 8) * round_up(nb, 128) if block_scales else 8 * cfg.tn) * 4
    ins = 2 * (cfg.tm * cfg.tk * lhs_itemsize + eb * cfg.tk * cfg.tn + scales)
    outs = 2 * cfg.tm * cfg.tn * out_itemsize
    temps = ck * cfg.tn * 4 + 3 * cfg.window * cfg.tn * 4 + (round_up(kb, 8) * cfg.tn * 4 if block_scales else 0)
    return ins + outs + cfg.tm * cfg.tn * 4 + temps


#: Vector element operations one TensorCore issues a cycle: 8 sublanes x 128 lanes x 4 ALU slots, the low end of
#: what the TPU cost model allows (src/tpu_cost_model/rates.py), so a tiling chosen to hide its dequantization under
#: the weight DMA still hides it on a slower vector unit.
VPU_OPS_PER_CYCLE = 4096
#: MXU multiply-accumulates a cycle per device (4 MXUs of 128 x 128 through v5, 256 x 256 from v6e; v4 and v5p run
#: two TensorCores as one device): with the bf16 peak it gives the clock. An unknown chip counts as v5e.
_MXU_MACS = {"v4": 8 * 128 * 128, "v5e": 4 * 128 * 128, "v5p": 8 * 128 * 128, "v6e": 4 * 256 * 256,
             "v7x": 4 * 256 * 256}
_CORES = {"v4": 2, "v5p": 2}
#: Per grid step, the high end of the unmeasured step-cost band (the Pallas TPU docs' ~0.35 us, 0.25-0.45 us): the
#: choice must hide the dequantization under the DMA at the slow end too.
STEP_SECONDS_HIGH = 0.45e-6
#: Vector element operations per row-window element and weight chunk: the partial product's scale, the row mask's
#: select and the add into the accumulator (the mask itself is one column).
WINDOW_OPS = 3


def vector_ops_per_s(chip: ChipFacts) -> float:
    """Vector element operations a second on one device of `chip` (VPU_OPS_PER_CYCLE at the MXU's clock)."""
    macs = _MXU_MACS.get(chip.name, _MXU_MACS["v5e"])
    return VPU_OPS_PER_CYCLE * _CORES.get(chip.name, 1) * chip.bf16_flops_per_s / (2 * macs)


def dequant_vector_ops(cfg: RaggedDotConfig, m: int, g: int, rows: float, kp: int, np_: int,
                       block_scales: bool) -> float:
    """Vector element operations of the quantized forward (uniform routing): each active expert's weights upcast
    once, and per weight chunk the row windows' scale, mask and accumulate (`rows` the rows the dots run on)."""
    active = g * (1.0 - (1.0 - 1.0 / g) ** m) if g else 0.0
    chunks = kp // cfg.tk * cdiv(cfg.tk, chunk_rows(cfg.tk, block_scales))
    return active * kp * np_ + WINDOW_OPS * rows * np_ * chunks


def quant_estimated_seconds(cfg: RaggedDotConfig, m: int, k: int, n: int, g: int, lhs_itemsize: int,
                            block_scales: bool, chip: ChipFacts) -> float:
    """The quantized forward's time (uniform routing) with 1-byte weights plus their scales: the DMAs against the
    compute, which is the longer of the bf16 MXU passes and the dequantization's vector work plus each step's cost
    at the high end of its band. Counting the vector work is what makes decode group several experts a step: one
    expert a step leaves the weight DMA waiting on upcasts and step costs."""
    eb, kp, np_, nk, nn, tiles, active_blocks, items, rows = forward_schedule(cfg, m, k, n, g)
    per_expert = kp * np_ + (cdiv(kp, BLOCK) * cdiv(np_, BLOCK) if block_scales else np_) * 4
    rhs = (active_blocks if nk == 1 else items) * eb * per_expert
    lhs = (tiles if nk == 1 else items) * cfg.tm * kp * nn * lhs_itemsize
    out = tiles * cfg.tm * np_ * lhs_itemsize
    passes = 6 if lhs_itemsize == 4 else 1
    mxu = 2.0 * rows * kp * np_ * passes / chip.bf16_flops_per_s
    vector = dequant_vector_ops(cfg, m, g, rows, kp, np_, block_scales) / vector_ops_per_s(chip)
    steps = items * nk * nn
    dma = (rhs + lhs + out) / (chip.hbm_bytes_per_s * STREAM_FRACTION)
    compute = max(mxu, vector) + steps * STEP_SECONDS_HIGH
    return max(dma, compute) + min(dma, compute) / max(steps, 1.0)


def choose_quant_config(m: int, k: int, n: int, g: int, lhs_dtype: object, block_scales: bool, *,
                        chip: ChipFacts | None = None) -> tuple[RaggedDotConfig, str]:
    """The quantized forward's tiles and why: the fastest estimate whose blocks fit chips.tile_budget_bytes (3/4 of
    the chip's VMEM; an unknown chip: 3/4 of 16 MiB), K and N tiles that need no padded weights when any fits. Block
    scales also need K and N tiles that are multiples of 128 or whole dims (a scale block never straddles two tiles)."""
    chip = chip or UNKNOWN_CHIP
    item = jnp.dtype(lhs_dtype).itemsize
    sublanes = 16 if item == 2 else 8
    if m <= 128:
        row_tiles = [max(sublanes, round_up(m, sublanes))]
    else:
        row_tiles = [t for t in (128, 256, 512, 1024) if t <= round_up(m, 128)]
    groups_per_step = [e for e in (1, 2, 4, 8, 16, 32) if e <= g and g % e == 0]
    budget = usable_vmem(2, tile_budget_bytes(chip))
    found = fastest_fitting(row_tiles, groups_per_step, k, n, budget,
                            lambda cfg: quant_vmem_bytes(decode_window(cfg, m, g), item, item, block_scales),
                            lambda cfg: quant_estimated_seconds(decode_window(cfg, m, g), m, k, n, g, item,
                                                                block_scales, chip))
    if found is not None:
        best, seconds, need, _ = found
        return with_vmem_limit(decode_window(best, m, g), need, 2, chip), (
            f"fastest quantized estimate on {chip.name} ({seconds * 1e6:.1f} us, even routing) "
            f"whose blocks ({need / _MIB:.1f} MiB) fit {budget / _MIB:.1f} MiB of VMEM")
    smallest = decode_window(RaggedDotConfig(tm=row_tiles[0], tk=128, tn=128), m, g)
    return smallest, "nothing fits the VMEM budget: the smallest tiles"


def decode_window(cfg: RaggedDotConfig, m: int, g: int) -> RaggedDotConfig:
    """cfg with row windows of about twice an expert's average rows (a multiple of 16) when that is narrower than its
    default: at decode each expert holds a few rows, and every window row costs an MXU row and the vector work of
    scaling and masking the partial product, so a 128-row window on 4 rows wastes most of both."""
    width = max(16, round_up(2 * cdiv(m, max(g, 1)), 16))
    narrower = width < cfg.window and cfg.tm % 16 == 0  # windows need a row tile of whole 16-row sublane tiles
    return dataclasses.replace(cfg, row_window=width) if narrower else cfg


def check_block_tiles(cfg: RaggedDotConfig, k: int, n: int) -> None:
    """Block scales need K and N tiles that are multiples of 128, or the whole (unpadded) dim."""
    for name, tile, dim in (("tk", cfg.tk, k), ("tn", cfg.tn, n)):
        if tile % BLOCK and tile < dim:
            raise ValueError(f"config.{name}={tile}: fp8 block scales need a multiple of {BLOCK} or the whole dim "
                             f"({dim})")


def _quant_kernel(
    items_ref, fetch_ref, offsets_ref,  # scalar prefetch (metadata.ForwardItems)
    lhs_ref, rhs_ref, scale_ref,  # inputs (VMEM blocks)
    out_ref,  # output block
    acc_ref, *sexp,  # scratch: f32 accumulator; the expanded block scales (fp8 only)
    tm: int, shift: int, window: int, experts: int, chunk: int, block_scales: bool, tn: int,
    precision: jax.lax.Precision | None,
) -> None:
    del fetch_ref
    k, last_k, base, lo, hi, first_visit, block = step_state(items_ref, offsets_ref, tm=tm, shift=shift,
                                                              experts=experts)
    tk = rhs_ref.shape[1]
    ct = lhs_ref.dtype
    full, tail = tk // chunk, tk % chunk

    @pl.when(jnp.logical_and(k == 0, first_visit))
    def _zero():
        out_ref[...] = jnp.zeros_like(out_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # the row mask as one column, broadcast by the select: built per window and chunk, so a full-width mask would
    # cost the vector unit as much again as scaling the partial product
    windows = functools.partial(row_windows, base=base, tm=tm, window=window, width=1)

    for j in range(experts):
        r0, r1 = expert_rows(j, experts, lo, hi, block, offsets_ref)

        @pl.when(r0 < r1)
        def _expert(j=j, r0=r0, r1=r1):
            if block_scales:  # the expert's [tk/128, tn/128] scales across the tile's columns: [tk/128, tn]
                nb = scale_ref.shape[-1]
                cols = jax.lax.broadcasted_iota(jnp.int32, (nb, tn), 1) // BLOCK
                spread = (cols == jax.lax.broadcasted_iota(jnp.int32, (nb, tn), 0)).astype(jnp.float32)
                kb = scale_ref.shape[-2]
                sexp[0][pl.ds(0, kb), :] = jax.lax.dot_general(
                    scale_ref[j], spread, (((1,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST,
                    preferred_element_type=jnp.float32)
                row_scale = lambda c: sexp[0][pl.ds(c, 1), :]
            else:
                row_scale = lambda c: scale_ref[j]

            def part(c0, width, c_index):
                w = rhs_ref[j, pl.ds(c0, width), :].astype(ct)
                s = row_scale(c_index)

                def dot(start, mine):
                    p = jax.lax.dot_general(lhs_ref[pl.ds(start, window), pl.ds(c0, width)], w,
                                            (((1,), (0,)), ((), ())), precision=precision,
                                            preferred_element_type=jnp.float32)
                    acc_ref[pl.ds(start, window), :] += jnp.where(mine, p * s, 0.0)

                windows(r0, r1, dot)

            if full:
                def chunk_step(c, carry):
                    part(pl.multiple_of(c * chunk, chunk), chunk, c)
                    return carry

                jax.lax.fori_loop(0, full, chunk_step, 0)
            if tail:  # a whole K tile that is no multiple of the chunk: its last, narrower chunk
                part(full * chunk, tail, full)

    @pl.when(jnp.logical_and(k == last_k, lo < hi))
    def _store():
        def store(start, mine):
            out_ref[pl.ds(start, window), :] = acc_ref[pl.ds(start, window), :].astype(out_ref.dtype)

        windows(lo, hi, store)


def arrange_block_scales(scale: jax.Array, kp: int, np_: int, tk: int, tn: int) -> jax.Array:
    """[G, ceil(K/128), ceil(N/128)] -> [G, Nt, Kt, ceil(tk/128), ceil(tn/128)]: one block per (n tile, k tile),
    zero-padded where K, N were padded to whole tiles (padded weights are zero too). Tiny: one f32 per 128x128.
    With one N tile the blocks are already in that order and a reshape gives them (no transpose for XLA to run)."""
    g = scale.shape[0]
    nt, kt = np_ // tn, kp // tk
    kb, nb = cdiv(tk, BLOCK), cdiv(tn, BLOCK)
    s = jnp.pad(scale, ((0, 0), (0, kt * kb - scale.shape[1]), (0, nt * nb - scale.shape[2])))
    if nt == 1:
        return s.reshape(g, 1, kt, kb, nb)
    return s.reshape(g, kt, kb, nt, nb).transpose(0, 3, 1, 2, 4)


@functools.partial(jax.jit, static_argnames=("cfg", "out_dtype", "interpret"))
def gmm_quant(
    lhs: jax.Array,
    rhs: jax.Array,
    scale: jax.Array,
    meta: GroupMetadata,
    *,
    offsets: jax.Array,
    cfg: RaggedDotConfig,
    out_dtype: jnp.dtype,
    interpret: object = False,
) -> jax.Array:
    """lhs [Mp, Kp] (bf16 or f32) x quantized rhs [G, Kp, Np] -> [Mp, Np]; all dims whole tiles. `scale`: int8
    per-channel [G, 1, Np] f32, or fp8 blocks as arrange_block_scales gives them ([G, Nt, Kt, tk/128, tn/128]).
    `offsets` ([G + 1], metadata.group_offsets): the rows each group owns."""
    tm, tk, tn = cfg.tm, cfg.tk, cfg.tn
    experts = cfg.experts_per_step
    mp, kp = lhs.shape
    g, _, np_ = rhs.shape
    block_scales = scale.ndim == 5
    items, shift, grid = forward_grid(meta, offsets, (mp, kp, np_), g, cfg, "gmm_quant")

    def rhs_map(n, i, k, items_ref, fetch, offsets_ref):
        return fetch_block(fetch, i, shift), k, n

    def channel_map(n, i, k, items_ref, fetch, offsets_ref):
        return fetch_block(fetch, i, shift), 0, n

    def block_map(n, i, k, items_ref, fetch, offsets_ref):
        return fetch_block(fetch, i, shift), n, k, 0, 0

    if block_scales:
        kb, nb = scale.shape[3], scale.shape[4]
        scale_spec = pl.BlockSpec((experts, None, None, kb, nb), block_map)
        scratch = [pltpu.VMEM((tm, tn), jnp.float32), pltpu.VMEM((round_up(kb, 8), tn), jnp.float32)]
    else:
        scale_spec = pl.BlockSpec((experts, 1, tn), channel_map)
        scratch = [pltpu.VMEM((tm, tn), jnp.float32)]
    precision = jax.lax.Precision.HIGHEST if lhs.dtype == jnp.float32 else None
    kernel = functools.partial(
        _quant_kernel, tm=tm, shift=shift, window=cfg.window, experts=experts, chunk=chunk_rows(tk, block_scales),
        block_scales=block_scales, tn=tn, precision=precision,
    )
    cost = pl.CostEstimate(
        flops=2 * mp * kp * np_,
        bytes_accessed=lhs.size * lhs.dtype.itemsize * (np_ // tn) + rhs.size + scale.size * 4
        + mp * np_ * jnp.dtype(out_dtype).itemsize,
        transcendentals=0,
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((mp, np_), out_dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(items),
            grid=grid,
            in_specs=[pl.BlockSpec((tm, tk), functools.partial(forward_lhs_map, shift=shift)),
                      pl.BlockSpec((experts, tk, tn), rhs_map), scale_spec],
            out_specs=pl.BlockSpec((tm, tn), functools.partial(forward_out_map, shift=shift)),
            scratch_shapes=scratch,
        ),
        compiler_params=compiler_params(cfg, ("parallel", "arbitrary", "arbitrary")),
        interpret=interpret,
        cost_estimate=cost,
    )(*items, lhs, rhs, scale)
