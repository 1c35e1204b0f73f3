"""Argument checks of ragged paged attention: shapes always, the page table and lengths when their values are known.

Concrete (non-traced) metadata gets one ValueError naming the first thing to fix. Traced metadata cannot be checked;
the implementations then clamp every page read into the cache and drop writes that would land outside it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class PagedShapes:
    """The static facts of one call, read off the shapes."""

    tokens: int
    q_heads: int
    kv_heads: int
    head_dim: int
    num_pages: int
    page_size: int
    max_seqs: int
    pages_per_seq: int
    sm_scale: float
    window: int | None
    soft_cap: float | None

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


def _concrete(x: Any) -> bool:
    return x is not None and not isinstance(x, jax.core.Tracer)


def check_paged_shapes(queries, keys, values, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, sinks, *,
                       sm_scale: float | None, sliding_window: int | None, soft_cap: float | None) -> PagedShapes:
    """PagedShapes, or ValueError naming the argument whose shape or dtype is wrong."""
    if queries.ndim != 3:
        raise ValueError(f"ragged_paged_attention: queries must be [tokens, q_heads, head_dim], got {queries.shape}")
    t, hq, d = queries.shape
    if k_cache.ndim != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("ragged_paged_attention: k_cache and v_cache must both be [num_pages, page_size, kv_heads, "
                         f"head_dim], got {k_cache.shape} and {v_cache.shape}")
    p, ps, hkv, dk = k_cache.shape
    if keys.shape != (t, hkv, d) or values.shape != (t, hkv, d):
        raise ValueError(f"ragged_paged_attention: keys and values must be [tokens, kv_heads, head_dim] = "
                         f"{(t, hkv, d)}, got {keys.shape} and {values.shape}")
    if dk != d:
        raise ValueError(f"ragged_paged_attention: the caches' head_dim {dk} differs from the queries' {d}")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"ragged_paged_attention: q_heads ({hq}) must be a multiple of kv_heads ({hkv})")
    if p == 0 or ps == 0:
        raise ValueError(f"ragged_paged_attention: the cache holds no pages (shape {k_cache.shape})")
    dtypes = {str(x.dtype) for x in (queries, keys, values, k_cache, v_cache)}
    if len(dtypes) != 1 or dtypes.pop() not in ("float32", "bfloat16"):
        raise ValueError("ragged_paged_attention: queries, keys, values and both caches must share one dtype, "
                         "float32 or bfloat16; got " + ", ".join(str(x.dtype) for x in (queries, keys, values,
                                                                                         k_cache, v_cache)))
    if kv_lens.ndim != 1:
        raise ValueError(f"ragged_paged_attention: kv_lens must be [num_seqs], got shape {kv_lens.shape}")
    s = kv_lens.shape[0]
    if page_indices.ndim != 2 or page_indices.shape[0] != s or page_indices.shape[1] == 0:
        raise ValueError(f"ragged_paged_attention: page_indices must be [num_seqs={s}, pages_per_seq >= 1], got "
                         f"shape {page_indices.shape}")
    if cu_q_lens.shape != (s + 1,):
        raise ValueError(f"ragged_paged_attention: cu_q_lens must be [num_seqs + 1] = [{s + 1}], got shape "
                         f"{cu_q_lens.shape}")
    for name, x in (("kv_lens", kv_lens), ("page_indices", page_indices), ("cu_q_lens", cu_q_lens)):
        if not np.issubdtype(np.dtype(x.dtype), np.integer):
            raise ValueError(f"ragged_paged_attention: {name} must be an integer array, got {x.dtype}")
    if sinks is not None and tuple(sinks.shape) != (hq,):
        raise ValueError(f"ragged_paged_attention: sinks must be [q_heads] = [{hq}], got shape {sinks.shape}")
    if sliding_window is not None and int(sliding_window) < 1:
        raise ValueError(f"ragged_paged_attention: sliding_window must be >= 1 or None, got {sliding_window}")
    if soft_cap is not None and not float(soft_cap) > 0:
        raise ValueError(f"ragged_paged_attention: soft_cap must be > 0 or None, got {soft_cap}")
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    return PagedShapes(t, hq, hkv, d, p, ps, s, page_indices.shape[1], scale,
                       None if sliding_window is None else int(sliding_window),
                       None if soft_cap is None else float(soft_cap))


def check_num_seqs(num_seqs: Any, max_seqs: int) -> None:
    if _concrete(num_seqs):
        n = int(np.asarray(num_seqs))
        if not 0 <= n <= max_seqs:
            raise ValueError(f"ragged_paged_attention: num_seqs must be in [0, {max_seqs}] (the rows of kv_lens), "
                             f"got {n}")


def check_paged_values(kv_lens, page_indices, cu_q_lens, num_seqs, sh: PagedShapes) -> None:
    """ValueError for a page table or lengths that would read or write outside the cache; nothing when any of them
    is traced (the kernel clamps instead)."""
    if not all(_concrete(x) for x in (kv_lens, page_indices, cu_q_lens)) or (
            num_seqs is not None and not _concrete(num_seqs)):
        return
    n = sh.max_seqs if num_seqs is None else int(np.asarray(num_seqs))
    lens, table, cu = np.asarray(kv_lens)[:n], np.asarray(page_indices)[:n], np.asarray(cu_q_lens)[:n + 1]
    steps = np.diff(cu)
    if cu[0] < 0 or (steps < 0).any():
        i = int(np.argmax(steps < 0)) if (steps < 0).any() else 0
        raise ValueError(f"ragged_paged_attention: cu_q_lens must start at >= 0 and never decrease; "
                         f"cu_q_lens[{i}:{i + 2}] = {cu[i:i + 2].tolist()}")
    if cu[-1] > sh.tokens:
        raise ValueError(f"ragged_paged_attention: cu_q_lens[num_seqs] = {int(cu[-1])} is past the {sh.tokens} "
                         "query rows given")
    if (lens < 0).any():
        i = int(np.argmax(lens < 0))
        raise ValueError(f"ragged_paged_attention: kv_lens[{i}] = {int(lens[i])} is negative")
    cap = sh.pages_per_seq * sh.page_size
    if (lens > cap).any():
        i = int(np.argmax(lens > cap))
        raise ValueError(f"ragged_paged_attention: kv_lens[{i}] = {int(lens[i])} is past the {sh.pages_per_seq} "
                         f"pages of {sh.page_size} positions page_indices gives each sequence ({cap})")
    if (steps > lens).any():
        i = int(np.argmax(steps > lens))
        raise ValueError(f"ragged_paged_attention: sequence {i} has {int(steps[i])} new tokens but kv_lens[{i}] = "
                         f"{int(lens[i])}; kv_lens counts the new tokens too, so it must be >= their number")
    used = np.arange(sh.pages_per_seq)[None, :] < -(-lens[:, None] // sh.page_size)
    bad = used & ((table < 0) | (table >= sh.num_pages))
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(f"ragged_paged_attention: page_indices[{i}, {j}] = {int(table[i, j])} is outside the "
                         f"cache's {sh.num_pages} pages")
