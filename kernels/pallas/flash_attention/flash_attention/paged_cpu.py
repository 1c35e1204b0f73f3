"""Ragged paged attention in plain XLA over the work items of paged_layout.

"cpu": walks each work item's pages a block at a time (a static loop of `steps` blocks of pages, an online softmax
across them), so only one block of pages per work item is ever resident: never a contiguous copy of the cache.
"xla": gathers each work item's whole page list and attends densely (the gather-then-attend baseline; portable).
Both compute logits and the softmax in f32. An fp8 cache is dequantized as the kernel does it: pages cast to the
queries' dtype, k_scale folded into the logits' scale and v_scale into the output's normalisation. Caches stacked
over layers are read at [layer, pages] (a gather from the stack, never a slice of a whole layer).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .paged_checks import PagedShapes
from .paged_layout import Meta, Work

_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)


def _dot(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    precision = None if a.dtype == b.dtype == jnp.bfloat16 else jax.lax.Precision.HIGHEST
    return jnp.einsum(spec, a, b, precision=precision, preferred_element_type=jnp.float32)


def _logits(q: jax.Array, k: jax.Array, sh: PagedShapes) -> jax.Array:
    s = _dot("whrd,wnhd->whrn", q, k.astype(q.dtype)) * (sh.sm_scale * sh.k_scale)
    return s if sh.soft_cap is None else sh.soft_cap * jnp.tanh(s / sh.soft_cap)


def _mask(cols: jax.Array, qpos: jax.Array, kv_len: jax.Array, sh: PagedShapes, causal: bool) -> jax.Array:
    """[W, 1, R, N]: row (position qpos[w, r]) sees column position cols[w, n]."""
    c, p = cols[:, None, None, :], qpos[:, None, :, None]
    ok = (p >= 0) & (c < kv_len[:, None, None, None])
    if causal:
        ok &= c <= p
    if sh.window is not None:
        ok &= c > p - sh.window
    return ok


def _finish(m, denom, acc, sinks_rows, v_scale: float):
    if sinks_rows is not None:
        sink = sinks_rows[None, :, :, None]
        top = jnp.maximum(m, sink)
        scale = jnp.exp(m - top)
        denom = denom * scale + jnp.exp(sink - top)
        acc = acc * scale
    return acc * v_scale / jnp.where(denom > 0, denom, 1.0)


def _values(v: jax.Array, cols: jax.Array, kv_len: jax.Array) -> jax.Array:
    """Values of positions past a sequence's end zeroed: whatever a page holds there (even NaN) never reaches out."""
    return jnp.where((cols < kv_len[:, None])[:, :, None, None], v, 0).astype(jnp.float32)


def _pages(cache: jax.Array, pages: jax.Array, layer) -> jax.Array:
    """cache[pages] of one layer's cache, or of layer `layer` of a stack."""
    return cache[pages] if layer is None else cache[layer, pages]


def cpu_paged(q_work, qpos, work: Work, k_cache, v_cache, meta: Meta, sh: PagedShapes, *, causal: bool,
              sinks_rows, pages_per_block: int, steps: int, layer=None) -> jax.Array:
    """[W, Hkv, R, D] f32 by walking `steps` blocks of `pages_per_block` pages per work item."""
    w_count, hkv, r, d = q_work.shape
    ps = sh.page_size
    n = pages_per_block * ps
    kv_len = meta.kv_len[work.seq]
    first = jnp.maximum(work.lo, 0) // ps  # the page holding each item's first position
    last_slot = jnp.maximum((kv_len + ps - 1) // ps - 1, 0)

    def body(kj, carry):
        m, denom, acc = carry
        page0 = first + kj * pages_per_block
        slots = jnp.minimum(page0[:, None] + jnp.arange(pages_per_block), last_slot[:, None])
        pages = meta.read_table[work.seq[:, None], slots]
        k = _pages(k_cache, pages, layer).reshape(w_count, n, hkv, d)
        cols = page0[:, None] * ps + jnp.arange(n)
        v = _values(_pages(v_cache, pages, layer).reshape(w_count, n, hkv, d), cols, kv_len)
        s = _logits(q_work, k, sh)
        ok = _mask(cols, qpos, kv_len, sh, causal)
        s = jnp.where(ok, s, _MASKED)
        m_new = jnp.maximum(m, s.max(-1, keepdims=True))
        p = jnp.where(ok, jnp.exp(s - m_new), 0.0)
        alpha = jnp.exp(m - m_new)
        acc = acc * alpha + _dot("whrn,wnhd->whrd", p, v)
        return m_new, denom * alpha + p.sum(-1, keepdims=True), acc

    init = (jnp.full((w_count, hkv, r, 1), _MASKED, jnp.float32), jnp.zeros((w_count, hkv, r, 1), jnp.float32),
            jnp.zeros((w_count, hkv, r, d), jnp.float32))
    m, denom, acc = jax.lax.fori_loop(0, steps, body, init)
    return _finish(m, denom, acc, sinks_rows, sh.v_scale)


def xla_paged(q_work, qpos, work: Work, k_cache, v_cache, meta: Meta, sh: PagedShapes, *, causal: bool,
              sinks_rows, layer=None) -> jax.Array:
    """[W, Hkv, R, D] f32: every page of each work item's sequence gathered, then one masked softmax."""
    w_count, hkv, _, d = q_work.shape
    length = sh.pages_per_seq * sh.page_size
    pages = meta.read_table[work.seq]
    kv_len = meta.kv_len[work.seq]
    cols = jnp.broadcast_to(jnp.arange(length), (w_count, length))
    k = _pages(k_cache, pages, layer).reshape(w_count, length, hkv, d)
    v = _values(_pages(v_cache, pages, layer).reshape(w_count, length, hkv, d), cols, kv_len)
    ok = _mask(cols, qpos, kv_len, sh, causal)
    s = jnp.where(ok, _logits(q_work, k, sh), _MASKED)
    m = s.max(-1, keepdims=True)
    p = jnp.where(ok, jnp.exp(s - m), 0.0)
    return _finish(m, p.sum(-1, keepdims=True), _dot("whrn,wnhd->whrd", p, v), sinks_rows, sh.v_scale)
