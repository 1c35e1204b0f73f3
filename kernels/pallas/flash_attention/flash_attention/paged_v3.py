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
import numpy as np

from .config import AttentionConfig
from .paged import ragged_paged_attention
from .paged_checks import host_or_traced


def num_sequences(distribution: Any, max_seqs: int) -> Any:
    """The sequence count RPA v3's `distribution` (decode end, prefill end, mixed end) carries in its last entry,
    after checking it: three integers, non-decreasing, the last within the kv_lens rows when concrete (a traced one:
    its shape and dtype; the count is then clamped)."""
    dist = host_or_traced(distribution)
    if dist.shape != (3,) or not np.issubdtype(np.dtype(dist.dtype), np.integer):
        raise ValueError(f"ragged_paged_attention_v3: distribution must be three integers (decode end, prefill end, "
                         f"mixed end = number of sequences), got {dist.dtype}{list(dist.shape)}")
    if isinstance(dist, jax.core.Tracer):
        return dist[2]
    d = np.asarray(dist).astype(np.int64).tolist()
    if not 0 <= d[0] <= d[1] <= d[2] <= max_seqs:
        raise ValueError(f"ragged_paged_attention_v3: distribution {d} must satisfy 0 <= decode end <= prefill end <= "
                         f"mixed end <= {max_seqs} (the rows of kv_lens)")
    return d[2]


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
    k_scale: float | None = None,
    v_scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """RPA v3's call (tpu_inference.kernels.ragged_paged_attention.v3.kernel.ragged_paged_attention) on our kernel.

    Args:
      queries [T, Hq, D], keys / values [T, Hkv, D]; kv_cache: RPA v3's fused layout (see the module docstring);
      kv_lens [S]; page_indices [S * pages_per_seq] (flattened); cu_q_lens [S + 1]; distribution i32[3], checked
      (0 <= decode end <= prefill end <= mixed end <= S when concrete) and of which only the last entry (the number of
      sequences) is used: ours needs no decode / prefill / mixed split.
      use_causal_mask, sm_scale (default 1.0, as RPA v3's), sliding_window, soft_cap: as RPA v3's. sinks: ours only.
      implementation / interpret / config: the kernel contract.
      k_scale, v_scale: as RPA v3's, for a float8_e4m3fn kv_cache (stored x means x * scale; static numbers).

    Returns:
      (out [T, Hq, D], kv_cache with the new tokens written), as RPA v3 returns them.
    """
    hkv, d = keys.shape[1], queries.shape[2]
    k_cache, v_cache = split_kv_cache(kv_cache, hkv, d)
    kv_lens, page_indices = host_or_traced(kv_lens), host_or_traced(page_indices)
    seqs = kv_lens.shape[0]
    if page_indices.ndim != 1 or (seqs and page_indices.shape[0] % seqs) or (not seqs and page_indices.shape[0]):
        raise ValueError(f"ragged_paged_attention_v3: page_indices must be flat [num_seqs * pages_per_seq] with "
                         f"num_seqs = {seqs} (the rows of kv_lens), got shape {page_indices.shape}")
    table = page_indices.reshape(seqs, -1 if seqs else 1)
    out, k_cache, v_cache = ragged_paged_attention(
        queries, keys, values, k_cache, v_cache, kv_lens, table, cu_q_lens, num_sequences(distribution, seqs),
        sinks=sinks, sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap, causal=use_causal_mask,
        implementation=implementation, interpret=interpret, config=config, k_scale=k_scale, v_scale=v_scale)
    return out, fuse_kv_cache(k_cache, v_cache, kv_cache)
