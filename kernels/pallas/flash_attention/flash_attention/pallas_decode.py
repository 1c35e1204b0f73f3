"""Pallas TPU decode attention: one new query per sequence against a KV cache with ragged lengths.

Grid (B, Hkv, cache blocks). The G query heads that share a kv head are processed together as the rows
of one [G, D] block, so each cache block is read from HBM once per kv head (decode is bandwidth-bound:
the cache read is the cost). Each sequence's length, and its sliding window, bound the cache blocks it
needs; the index map clamps the block index into that range, so blocks past a short sequence's end are
never fetched and their steps do no work. The query sits at position kv_len - 1 (its own key is
already in the cache) and attends keys max(0, kv_len - W) .. kv_len - 1.
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
from .pallas_flash import MASKED, _dot, online_softmax_step


@dataclasses.dataclass(frozen=True)
class DecodeStatic:
    sm_scale: float
    window: int | None
    soft_cap: float | None
    has_sinks: bool
    block_kv: int
    interpret: Any = False
    vmem_limit_bytes: int | None = None


def cache_block_range(kv_len: jax.Array, st: DecodeStatic):
    """(first, last, empty, lo): cache blocks holding keys max(0, kv_len - W) .. kv_len - 1."""
    lo = jnp.int32(0) if st.window is None else jnp.maximum(kv_len - st.window, 0)
    last = jnp.maximum(kv_len - 1, 0) // st.block_kv
    return lo // st.block_kv, last, kv_len <= 0, lo


def _decode_kernel(kvlen_ref, q_ref, k_ref, v_ref, sinks_ref, o_ref, m_scr, l_scr, acc_scr, *, st: DecodeStatic):
    b, kj = pl.program_id(0), pl.program_id(2)
    kv_len = kvlen_ref[b]
    first, last, empty, lo = cache_block_range(kv_len, st)

    @pl.when(kj == 0)
    def _init():
        m_scr[...] = jnp.full(m_scr.shape, MASKED, jnp.float32)
        l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when(jnp.logical_not(empty) & (kj >= first) & (kj <= last))
    def _step():
        v = v_ref[...]
        s = _dot(q_ref[...], k_ref[...], (1, 1)) * st.sm_scale  # [G, bk]
        if st.soft_cap is not None:
            s = st.soft_cap * jnp.tanh(s / st.soft_cap)
        cols = kj * st.block_kv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        mask = (cols < kv_len) & (cols >= lo)
        online_softmax_step(s, mask, v, m_scr, l_scr, acc_scr)

    @pl.when(kj == pl.num_programs(2) - 1)
    def _finish():
        m, denom, acc = m_scr[...], l_scr[...], acc_scr[...]
        if st.has_sinks:
            sink = sinks_ref[...]  # [G, LANES], each row one head's sink
            m_fin = jnp.maximum(m, sink)
            rescale = jnp.exp(m - m_fin)
            denom = denom * rescale + jnp.exp(sink - m_fin)
            acc = acc * rescale[:, :1]
        safe_l = jnp.where(denom > 0, denom, 1.0)
        o_ref[...] = (acc / safe_l[:, :1]).astype(o_ref.dtype)


def decode_forward(q, k_cache, v_cache, kv_len, sinks, st: DecodeStatic):
    """q [B,Hkv,G,D], caches [B,Hkv,S,D] (S a multiple of block_kv), sinks [Hkv,G] f32 -> [B,Hkv,G,D]."""
    b, hkv, g, d = q.shape
    s = k_cache.shape[2]
    bk = st.block_kv
    sinks_wide = jnp.broadcast_to(sinks[:, :, None], (hkv, g, LANES))

    def kv_map(bi, hk, kj, kvlen_ref):
        first, last, empty, _ = cache_block_range(kvlen_ref[bi], st)
        return bi, hk, jnp.where(empty, 0, jnp.clip(kj, first, last)), 0

    q_map = lambda bi, hk, kj, *_: (bi, hk, 0, 0)
    return pl.pallas_call(
        functools.partial(_decode_kernel, st=st),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(b, hkv, s // bk),
            in_specs=[
                pl.BlockSpec((None, None, g, d), q_map),
                pl.BlockSpec((None, None, bk, d), kv_map),
                pl.BlockSpec((None, None, bk, d), kv_map),
                pl.BlockSpec((None, g, LANES), lambda bi, hk, kj, *_: (hk, 0, 0)),
            ],
            out_specs=pl.BlockSpec((None, None, g, d), q_map),
            scratch_shapes=[
                pltpu.VMEM((g, LANES), jnp.float32),
                pltpu.VMEM((g, LANES), jnp.float32),
                pltpu.VMEM((g, d), jnp.float32),
            ],
        ),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=st.vmem_limit_bytes,
        ),
        interpret=st.interpret,
        name="flash_decode_attention",
    )(kv_len, q, k_cache, v_cache, sinks_wide)
