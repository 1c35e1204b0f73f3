"""The new tokens' K/V written into their pages by a Pallas kernel whose cache outputs alias its cache inputs.

Why a kernel and not `cache.at[page, slot].set(...)`: under a jit that donates the caches, XLA's scatter is in place
too, but the attention kernel then needs the cache in some layout, and any reshape XLA cannot make a bitcast copies a
whole cache. Here the caches pass through untouched ([pages, page_size, Hkv, D], memory_space ANY), each valid token
row is one DMA of its [Hkv, D] keys (and values) from HBM to HBM at (page, slot), and `input_output_aliases` hands
the same buffers back: with donation nothing is copied; without it XLA makes one copy of each cache so the caller's
arrays stay intact.

An fp8 cache gets its rows quantized on store (quantize_rows: scaled, clipped to e4m3's range, cast) before the
DMAs: only the T new rows are touched, never the cache.

Rows whose destination page is negative (padding, a write aimed outside the cache) issue no DMA.

Caches stacked over layers ([L, pages, page_size, Hkv, D]) are written the same way at [layer, page, slot], the
layer a scalar-prefetched operand (traced, e.g. a scan's counter): the outputs alias the whole stacks, so no layer is
ever sliced out or written back.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .paged_quant import quantize_rows


def _kernel(page_ref, slot_ref, layer_ref, keys_hbm, values_hbm, _k_in, _v_in, k_out, v_out, sems):
    tokens = keys_hbm.shape[0]
    stacked = k_out.ndim == 5

    def copies(t):
        at = (layer_ref[0], page_ref[t], slot_ref[t]) if stacked else (page_ref[t], slot_ref[t])
        return (pltpu.make_async_copy(keys_hbm.at[t], k_out.at[at], sems.at[0]),
                pltpu.make_async_copy(values_hbm.at[t], v_out.at[at], sems.at[1]))

    def start(t, carry):
        @pl.when(page_ref[t] >= 0)
        def _():
            for c in copies(t):
                c.start()
        return carry

    def wait(t, carry):
        @pl.when(page_ref[t] >= 0)
        def _():
            for c in copies(t):
                c.wait()
        return carry

    jax.lax.fori_loop(0, tokens, start, 0)
    jax.lax.fori_loop(0, tokens, wait, 0)


def write_pages(k_cache: jax.Array, v_cache: jax.Array, keys: jax.Array, values: jax.Array, page: jax.Array,
                slot: jax.Array, *, interpret: Any = False, k_scale: float = 1.0,
                v_scale: float = 1.0, layer: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(k_cache, v_cache) with keys[t] / values[t] at [page[t], slot[t]] for every t with page[t] >= 0.

    k_cache, v_cache [P, page_size, Hkv, D], or [L, P, page_size, Hkv, D] with `layer` (int32 scalar in [0, L)):
    the rows go to [layer, page[t], slot[t]] and every other layer is untouched; keys, values [T, Hkv, D] (stored as
    quantize_rows makes them, with k_scale / v_scale for an fp8 cache); page, slot int32 [T]
    (page in [0, P) or negative: skipped; slot in [0, page_size))."""
    layer_arr = jnp.zeros((1,), jnp.int32) if layer is None else jnp.asarray(layer, jnp.int32).reshape(1)
    any_ = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        _kernel,
        out_shape=(jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype),
                   jax.ShapeDtypeStruct(v_cache.shape, v_cache.dtype)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3,
            grid=(1,),
            in_specs=[any_, any_, any_, any_],
            out_specs=(any_, any_),
            scratch_shapes=[pltpu.SemaphoreType.DMA((2,))],
        ),
        # operand indices count the scalar-prefetch arrays: page 0, slot 1, layer 2, keys 3, values 4, caches 5, 6
        input_output_aliases={5: 0, 6: 1},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
        name="ragged_paged_attention_cache_write",
    )(page.astype(jnp.int32), slot.astype(jnp.int32), layer_arr, quantize_rows(keys, k_cache.dtype, k_scale),
      quantize_rows(values, v_cache.dtype, v_scale),
      k_cache, v_cache)
