"""Pallas TPU decode attention: one new query per sequence against a KV cache with ragged lengths.

Grid (B, cache blocks): one step reads one block of cache positions for *every* kv head of a sequence, and
processes the G query heads that share each kv head as the rows of one [G, D] tile, so the cache is read from
HBM exactly once and the grid has B x blocks steps (not B x Hkv x blocks: at 0.35 us a step, per-head steps
cost as much as the cache read itself at small head dims). Decode is bandwidth-bound: the cache read is the cost.

Each sequence's length, and its sliding window, bound the cache blocks it needs; the index map clamps the
block index into that range, so blocks past a short sequence's end are never fetched and their steps do no
work. With a window the grid only spans the blocks a window can touch, offset to each sequence's first one.
The query sits at position kv_len - 1 (its own key is already in the cache) and attends keys
max(0, kv_len - W) .. kv_len - 1.

Cache layout: XLA's TPU layout stores a [.., S, D] array with S as the minor (lane) dimension when that pads
less (small head dims: D=64 pads to 128 lanes, S does not). The kernel then reads the cache as [.., D, S] blocks
(`kv_transposed`), which is the same bytes: XLA passes it through instead of copying the whole cache into a
row-major layout before every call (a 1 GiB copy per K and V at GPT-OSS decode shapes).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .config import LANES
from .pallas_flash import MASKED, _clamp, _dot, finish_softmax, online_softmax_step


@dataclasses.dataclass(frozen=True)
class DecodeStatic:
    sm_scale: float
    window: int | None
    soft_cap: float | None
    has_sinks: bool
    block_kv: int
    interpret: Any = False
    vmem_limit_bytes: int | None = None
    kv_transposed: bool = False  # caches given as [B, Hkv, D, S] (see the module docstring)


def cache_block_range(kv_len: jax.Array, st: DecodeStatic):
    """(first, last, empty, lo): cache blocks holding keys max(0, kv_len - W) .. kv_len - 1."""
    lo = jnp.int32(0) if st.window is None else jnp.maximum(kv_len - st.window, 0)
    last = jnp.maximum(kv_len - 1, 0) // st.block_kv
    return lo // st.block_kv, last, kv_len <= 0, lo


def cache_steps(cache_len: int, st: DecodeStatic) -> int:
    """Grid steps per sequence: every block, or (with a window) only as many as a window can touch."""
    blocks = cache_len // st.block_kv
    return blocks if st.window is None else min(blocks, (st.window - 1) // st.block_kv + 2)


def _block_of(kj: jax.Array, kv_len: jax.Array, st: DecodeStatic) -> jax.Array:
    """The cache block step kj reads: offset to the window's first block, clamped into [first, last] so a step
    past the range re-addresses the resident block (no DMA)."""
    first, last, empty, _ = cache_block_range(kv_len, st)
    idx = kj if st.window is None else first + kj
    return _clamp(idx, first, last, empty)


def _decode_kernel(kvlen_ref, q_ref, k_ref, v_ref, sinks_ref, o_ref, m_scr, l_scr, acc_scr, *, st: DecodeStatic):
    b, kj = pl.program_id(0), pl.program_id(1)
    kv_len = kvlen_ref[b]
    first, last, empty, lo = cache_block_range(kv_len, st)
    block = kj if st.window is None else first + kj
    heads = q_ref.shape[0]

    @pl.when(kj == 0)
    def _init():
        m_scr[...] = jnp.full(m_scr.shape, MASKED, jnp.float32)
        l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when(jnp.logical_not(empty) & (block >= first) & (block <= last))
    def _step():
        for h in range(heads):  # static: the kv heads of this sequence, each with its G query rows
            # k, v blocks are [D, bk] (transposed) or [bk, D]
            s = _dot(q_ref[h], k_ref[h], (1, 0) if st.kv_transposed else (1, 1)) * st.sm_scale  # [G, bk]
            if st.soft_cap is not None:
                s = st.soft_cap * jnp.tanh(s / st.soft_cap)
            cols = block * st.block_kv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
            mask = (cols < kv_len) & (cols >= lo)
            online_softmax_step(s, mask, v_ref[h], m_scr.at[h], l_scr.at[h], acc_scr.at[h],
                                values_transposed=st.kv_transposed)

    @pl.when(kj == pl.num_programs(1) - 1)
    def _finish():
        for h in range(heads):
            sink = sinks_ref[h] if st.has_sinks else None  # [G, LANES], each row one head's sink
            o_ref[h] = finish_softmax(m_scr[h], l_scr[h], acc_scr[h], sink).astype(o_ref.dtype)


def decode_forward(q, k_cache, v_cache, kv_len, sinks, st: DecodeStatic):
    """q [B,Hkv,G,D]; caches [B,Hkv,S,D], or [B,Hkv,D,S] with st.kv_transposed (S a multiple of block_kv);
    sinks [Hkv,G] f32 -> [B,Hkv,G,D]."""
    b, hkv, g, d = q.shape
    s = k_cache.shape[3 if st.kv_transposed else 2]
    bk = st.block_kv
    sinks_wide = jnp.broadcast_to(sinks[:, :, None], (hkv, g, LANES))

    if st.kv_transposed:
        kv_block = (None, hkv, d, bk)
        kv_map = lambda bi, kj, kvlen_ref: (bi, 0, 0, _block_of(kj, kvlen_ref[bi], st))
    else:
        kv_block = (None, hkv, bk, d)
        kv_map = lambda bi, kj, kvlen_ref: (bi, 0, _block_of(kj, kvlen_ref[bi], st), 0)
    q_map = lambda bi, kj, *_: (bi, 0, 0, 0)
    return pl.pallas_call(
        functools.partial(_decode_kernel, st=st),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(b, cache_steps(s, st)),
            in_specs=[
                pl.BlockSpec((None, hkv, g, d), q_map),
                pl.BlockSpec(kv_block, kv_map),
                pl.BlockSpec(kv_block, kv_map),
                pl.BlockSpec((hkv, g, LANES), lambda bi, kj, *_: (0, 0, 0)),
            ],
            out_specs=pl.BlockSpec((None, hkv, g, d), q_map),
            scratch_shapes=[
                pltpu.VMEM((hkv, g, LANES), jnp.float32),
                pltpu.VMEM((hkv, g, LANES), jnp.float32),
                pltpu.VMEM((hkv, g, d), jnp.float32),
            ],
        ),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=st.vmem_limit_bytes,
        ),
        interpret=st.interpret,
        name="flash_decode_attention",
    )(kv_len, q, k_cache, v_cache, sinks_wide)
