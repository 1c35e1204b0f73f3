"""The new tokens' K/V written into their pages by a Pallas kernel whose cache outputs alias its cache inputs.

Why a kernel and not `cache.at[page, slot].set(...)`: under a jit that donates the caches, XLA's scatter is in place
too, but the attention kernel then needs the cache in some layout, and any reshape XLA cannot make a bitcast copies a
whole cache. Here the caches pass through untouched ([pages, page_size, Hkv, D], memory_space ANY), the new rows are
copied by DMAs from HBM to HBM, and `input_output_aliases` hands the same buffers back: with donation nothing is
copied; without it XLA makes one copy of each cache so the caller's arrays stay intact.

Runs, not rows: consecutive token rows that land in consecutive slots of one page (a prefill chunk fills whole pages
row after row) are one run, found before the call (row_runs: vectorised, no loop over tokens) and passed as
scalar-prefetch arrays. A DMA's shape must be static on TPU, so a run of n rows is copied as the powers of two in n's
binary form (at most log2(page_size) + 1 DMAs, largest first): a 496-token chunk over pages of 128 is 4 or 5 runs and
at most 8 DMAs each, instead of 496 row copies. Distinct runs never share a slot unless two rows name the same slot,
which the entry's checks refuse.

An fp8 cache gets its rows quantized on store (quantize_rows: scaled, clipped to e4m3's range, cast) before the
DMAs: only the T new rows are touched, never the cache.

Rows whose destination page is negative (padding, a write aimed outside the cache) belong to no run: no DMA.

Caches stacked over layers ([L, pages, page_size, Hkv, D]) are written the same way at [layer, page, slot], the
layer a scalar-prefetched operand (traced, e.g. a scan's counter): the outputs alias the whole stacks, so no layer is
ever sliced out or written back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .paged_quant import quantize_rows


@dataclasses.dataclass(frozen=True)
class Runs:
    """Runs of token rows written by one DMA group each, packed at the front of [max_runs] arrays."""

    row: jax.Array  # [R] int32 first token row of each run
    page: jax.Array  # [R] its page
    slot: jax.Array  # [R] the slot its first row lands in
    length: jax.Array  # [R] rows in the run (0 past `count`)
    count: jax.Array  # [1] int32 runs in use


def row_runs(page: jax.Array, slot: jax.Array, max_runs: int) -> Runs:
    """The maximal runs of rows t, t+1, ... with page[t] >= 0, one page and slots slot[t], slot[t] + 1, ...

    A run never leaves its page (the next slot of a page's last slot is another page's), so its length is at most
    page_size. max_runs must bound the number of runs (row count always does); runs past it are dropped."""
    tokens = page.shape[0]
    page, slot = page.astype(jnp.int32), slot.astype(jnp.int32)
    valid = page >= 0
    prev_page = jnp.concatenate([jnp.full((1,), -1, jnp.int32), page[:-1]])
    prev_slot = jnp.concatenate([jnp.full((1,), -2, jnp.int32), slot[:-1]])
    follows = valid & (prev_page == page) & (prev_slot + 1 == slot)  # row t continues the run of row t - 1
    first = valid & ~follows
    last = valid & ~jnp.concatenate([follows[1:], jnp.zeros((1,), bool)])
    rows = jnp.arange(tokens, dtype=jnp.int32)

    def packed(mask: jax.Array) -> jax.Array:
        """Rows where mask holds, in order, at the front of a [max_runs] array (the k-th run's first or last)."""
        at = jnp.where(mask, jnp.cumsum(mask.astype(jnp.int32)) - 1, max_runs)
        return jnp.zeros((max_runs,), jnp.int32).at[at].set(rows, mode="drop")

    count = jnp.minimum(jnp.sum(first.astype(jnp.int32)), max_runs)
    start, end = packed(first), packed(last)
    used = jnp.arange(max_runs, dtype=jnp.int32) < count
    return Runs(start, page[start], slot[start], jnp.where(used, end - start + 1, 0), count.reshape(1))


def piece_sizes(longest: int) -> tuple[int, ...]:
    """The static DMA lengths, largest first: every power of two up to `longest` (the longest run: page_size, or
    the rows given when fewer), enough to sum to any run."""
    return tuple(1 << b for b in reversed(range(longest.bit_length())))


def _kernel(row_ref, page_ref, slot_ref, len_ref, count_ref, layer_ref, keys_hbm, values_hbm, _k_in, _v_in, k_out,
            v_out, sems):
    stacked = k_out.ndim == 5
    sizes = piece_sizes(min(k_out.shape[-3], keys_hbm.shape[0]))  # a run fits its page and the rows given

    def each_piece(r, act):
        """act(copy) for the DMAs of run r: the piece of `size` rows is present when that bit of the length is set,
        at the offset the higher bits add up to (lax.div / lax.rem: the length is never negative)."""
        row, page, slot, n = row_ref[r], page_ref[r], slot_ref[r], len_ref[r]
        for size in sizes:
            off = jax.lax.div(n, 2 * size) * (2 * size)

            @pl.when(jax.lax.rem(jax.lax.div(n, size), 2) == 1)
            def _(off=off, size=size):
                dst = pl.ds(slot + off, size)
                at = (layer_ref[0], page, dst) if stacked else (page, dst)
                src = pl.ds(row + off, size)
                act(pltpu.make_async_copy(keys_hbm.at[src], k_out.at[at], sems.at[0]))
                act(pltpu.make_async_copy(values_hbm.at[src], v_out.at[at], sems.at[1]))

    def start(r, carry):
        each_piece(r, lambda c: c.start())
        return carry

    def wait(r, carry):
        each_piece(r, lambda c: c.wait())
        return carry

    jax.lax.fori_loop(0, count_ref[0], start, 0)
    jax.lax.fori_loop(0, count_ref[0], wait, 0)


def write_pages(k_cache: jax.Array, v_cache: jax.Array, keys: jax.Array, values: jax.Array, page: jax.Array,
                slot: jax.Array, *, interpret: Any = False, k_scale: float = 1.0,
                v_scale: float = 1.0, layer: jax.Array | None = None,
                max_runs: int | None = None) -> tuple[jax.Array, jax.Array]:
    """(k_cache, v_cache) with keys[t] / values[t] at [page[t], slot[t]] for every t with page[t] >= 0.

    k_cache, v_cache [P, page_size, Hkv, D], or [L, P, page_size, Hkv, D] with `layer` (int32 scalar in [0, L)):
    the rows go to [layer, page[t], slot[t]] and every other layer is untouched; keys, values [T, Hkv, D] (stored as
    quantize_rows makes them, with k_scale / v_scale for an fp8 cache); page, slot int32 [T]
    (page in [0, P) or negative: skipped; slot in [0, page_size)); max_runs: a static bound on the runs (row_runs)
    the rows form, the size of the scalar-prefetch arrays (default T, always a bound)."""
    tokens = keys.shape[0]
    runs = row_runs(page, slot, min(tokens, max_runs or tokens))
    layer_arr = jnp.zeros((1,), jnp.int32) if layer is None else jnp.asarray(layer, jnp.int32).reshape(1)
    any_ = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        _kernel,
        out_shape=(jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype),
                   jax.ShapeDtypeStruct(v_cache.shape, v_cache.dtype)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=6,
            grid=(1,),
            in_specs=[any_, any_, any_, any_],
            out_specs=(any_, any_),
            scratch_shapes=[pltpu.SemaphoreType.DMA((2,))],
        ),
        # operand indices count the scalar-prefetch arrays: run row 0, page 1, slot 2, length 3, count 4, layer 5,
        # keys 6, values 7, caches 8, 9
        input_output_aliases={8: 0, 9: 1},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
        name="ragged_paged_attention_cache_write",
    )(runs.row, runs.page, runs.slot, runs.length, runs.count, layer_arr,
      quantize_rows(keys, k_cache.dtype, k_scale), quantize_rows(values, v_cache.dtype, v_scale), k_cache, v_cache)
