"""The vLLM TPU face of ragged paged attention: tpu-inference's RPA v3 argument order, names and fused cache layout.

RPA v3 keeps K and V in one cache, [pages, page_size, 2 * Hkv / packing, packing, D128] (heads interleaved k0, v0,
k1, v1, ..., padded to the dtype's packing; head dim padded to a multiple of 128), a flattened page table and a
`distribution` triple whose last entry is the number of sequences. This adapter splits that cache into the
[pages, page_size, Hkv, D] pair ours reads, calls ragged_paged_attention and fuses the result back: two copies of
the cache per call, the price of a drop-in; a server that owns its cache should keep it in ours' layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .config import AttentionConfig
from .paged import ragged_paged_attention


def split_kv_cache(kv_cache: jax.Array, kv_heads: int, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """RPA v3's fused cache -> (k_cache, v_cache) [pages, page_size, Hkv, D]."""
    pages, page_size = kv_cache.shape[:2]
    merged = kv_cache.reshape(pages, page_size, -1, kv_cache.shape[-1])[:, :, : 2 * kv_heads, :head_dim]
    return merged[:, :, 0::2], merged[:, :, 1::2]


def fuse_kv_cache(k_cache: jax.Array, v_cache: jax.Array, like: jax.Array) -> jax.Array:
    """(k_cache, v_cache) -> a fused cache shaped (and padded) like RPA v3's `like`."""
    pages, page_size, hkv, d = k_cache.shape
    merged = jnp.stack([k_cache, v_cache], axis=3).reshape(pages, page_size, 2 * hkv, d)
    heads_x2 = like.shape[2] * like.shape[3]
    merged = jnp.pad(merged, ((0, 0), (0, 0), (0, heads_x2 - 2 * hkv), (0, like.shape[-1] - d)))
    return merged.reshape(like.shape).astype(like.dtype)


def ragged_paged_attention_v3(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    kv_cache: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    distribution: jax.Array,
    *,
    use_causal_mask: bool = True,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
    config: AttentionConfig | None = None,
) -> tuple[jax.Array, jax.Array]:
    """RPA v3's call (tpu_inference.kernels.ragged_paged_attention.v3.kernel.ragged_paged_attention) on our kernel.

    Args:
      queries [T, Hq, D], keys / values [T, Hkv, D]; kv_cache: RPA v3's fused layout (see the module docstring);
      kv_lens [S]; page_indices [S * pages_per_seq] (flattened); cu_q_lens [S + 1]; distribution i32[3], of which
      only the last entry (the number of sequences) is read: ours needs no decode / prefill / mixed split.
      use_causal_mask, sm_scale (default 1.0, as RPA v3's), sliding_window, soft_cap: as RPA v3's. sinks: ours only.
      implementation / interpret / config: the kernel contract.

    Returns:
      (out [T, Hq, D], kv_cache with the new tokens written), as RPA v3 returns them.
    """
    hkv, d = keys.shape[1], queries.shape[2]
    k_cache, v_cache = split_kv_cache(kv_cache, hkv, d)
    seqs = kv_lens.shape[0]
    table = jnp.asarray(page_indices).reshape(seqs, -1)
    out, k_cache, v_cache = ragged_paged_attention(
        queries, keys, values, k_cache, v_cache, kv_lens, table, cu_q_lens, jnp.asarray(distribution)[2],
        sinks=sinks, sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap, causal=use_causal_mask,
        implementation=implementation, interpret=interpret, config=config)
    return out, fuse_kv_cache(k_cache, v_cache, kv_cache)
