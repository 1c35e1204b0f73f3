"""Argument checks of ragged paged attention: shapes always, the page table and lengths when their values are known.

Concrete (non-traced) metadata gets one ValueError naming the first thing to fix, checked in the dtype it came in
(int64 page ids are compared as int64, never cut to int32 first). Traced metadata cannot be checked: its shapes and
dtypes are, and `as_int32` saturates a wider integer dtype instead of wrapping it, so the implementations' clamps
(reads into the cache, writes outside it dropped) still see an out-of-range value as out of range. Under a caller's
jit with x64 off, JAX itself converts int64 arguments to int32 at the jit boundary, before this code runs: check
int64 metadata on the host (or pass int32) there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .paged_args import int_arg, scale_arg, soft_cap_arg, window_arg
from .paged_quant import FP8_KV

_WHO = "ragged_paged_attention"
_INT32 = np.iinfo(np.int32)


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
    k_scale: float = 1.0  # an fp8 cache's stored value x means x * k_scale (1.0 for a float cache)
    v_scale: float = 1.0

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


def _concrete(x: Any) -> bool:
    return x is not None and not isinstance(x, jax.core.Tracer)


def host_or_traced(x: Any) -> Any:
    """Metadata as given, without the int32 conversion jnp.asarray applies (x64 off): a tracer or jax array as is,
    anything else as a NumPy array in its own dtype (int64 stays int64 for the checks)."""
    return x if isinstance(x, jax.Array) else np.asarray(x)


def as_int32(x: Any) -> jax.Array:
    """Integer metadata as int32 for the kernels, saturating (never wrapping) a wider dtype: 2**32 + 1 becomes
    2**31 - 1, still past every cache, where a plain cast would make it 1."""
    dtype = np.dtype(x.dtype)
    if dtype == np.int32:
        return jnp.asarray(x)
    if isinstance(x, np.ndarray):
        info = np.iinfo(dtype)
        return jnp.asarray(np.clip(x, max(info.min, _INT32.min), min(info.max, _INT32.max)).astype(np.int32))
    if np.iinfo(dtype).max > _INT32.max:
        x = jnp.minimum(x, jnp.asarray(_INT32.max, dtype))
    if np.iinfo(dtype).min < _INT32.min:
        x = jnp.maximum(x, jnp.asarray(_INT32.min, dtype))
    return x.astype(jnp.int32)


def _host_ints(name: str, x: Any) -> np.ndarray:
    """Concrete metadata as int64 NumPy for the checks; an unsigned value past int64 is refused here."""
    a = np.asarray(x)
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{_WHO}: {name} holds {int(a.max())}, past any cache")
    return a.astype(np.int64)


def check_paged_shapes(queries, keys, values, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, sinks, *,
                       sm_scale: float | None, sliding_window: int | None, soft_cap: float | None,
                       k_scale: float | None = None, v_scale: float | None = None) -> PagedShapes:
    """PagedShapes, or ValueError naming the argument whose shape or dtype is wrong."""
    if queries.ndim != 3:
        raise ValueError(f"ragged_paged_attention: queries must be [tokens, q_heads, head_dim], got {queries.shape}")
    t, hq, d = queries.shape
    if k_cache.ndim != 4 or k_cache.shape != v_cache.shape:
        stacked = " (caches stacked over layers take layer=)" if k_cache.ndim == 5 else ""
        raise ValueError("ragged_paged_attention: k_cache and v_cache must both be [num_pages, page_size, kv_heads, "
                         f"head_dim], got {k_cache.shape} and {v_cache.shape}{stacked}")
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
    _check_dtypes(queries, keys, values, k_cache, v_cache)
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
    window = window_arg(_WHO, sliding_window)
    if window is not None and window >= page_indices.shape[1] * ps:
        window = None  # wider than any sequence the page table can hold: it masks nothing
    cap = soft_cap_arg(_WHO, soft_cap)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    ks, vs = scale_arg(_WHO, "k_scale", k_scale), scale_arg(_WHO, "v_scale", v_scale)
    if str(k_cache.dtype) != FP8_KV and any(x not in (None, 1.0) for x in (ks, vs)):
        raise ValueError(f"{_WHO}: k_scale / v_scale apply to {FP8_KV} caches only; these are {k_cache.dtype} "
                         "(pass no scales, or store the caches in float8_e4m3fn)")
    return PagedShapes(t, hq, hkv, d, p, ps, s, page_indices.shape[1], scale, window, cap,
                       1.0 if ks is None else ks, 1.0 if vs is None else vs)


def _check_dtypes(queries, keys, values, k_cache, v_cache) -> None:
    """queries, keys and values share float32 or bfloat16; both caches share that dtype or float8_e4m3fn."""
    names = [str(x.dtype) for x in (queries, keys, values, k_cache, v_cache)]
    q = names[0]
    if len(set(names[:3])) == 1 and q in ("float32", "bfloat16") and names[3] == names[4] in (q, FP8_KV):
        return
    raise ValueError(f"{_WHO}: queries, keys and values must share one dtype, float32 or bfloat16, and both caches "
                     f"that dtype or {FP8_KV} (quantized, with k_scale / v_scale); got " + ", ".join(names))


def check_layer(layer: Any, k_cache: Any, v_cache: Any) -> tuple[jax.Array, Any, Any]:
    """(layer as an int32 scalar, one layer's k and v cache shapes) for caches stacked over layers, or one ValueError
    naming what to fix: caches not [layers, num_pages, page_size, kv_heads, head_dim], a layer that is not an integer
    scalar, a concrete layer outside [0, layers). A traced layer is clamped into the stack (nothing is read or written
    outside it), as traced page ids are."""
    if k_cache.ndim != 5 or k_cache.shape != v_cache.shape:
        raise ValueError(f"{_WHO}: with layer=, k_cache and v_cache must both be stacked over layers, [layers, "
                         f"num_pages, page_size, kv_heads, head_dim]; got {k_cache.shape} and {v_cache.shape} (pass "
                         "layer=None for one layer's [num_pages, page_size, kv_heads, head_dim] caches)")
    layers = k_cache.shape[0]
    if layers == 0:
        raise ValueError(f"{_WHO}: the stacked caches hold no layers (shape {k_cache.shape})")
    if isinstance(layer, bool) or np.ndim(layer) != 0 or not np.issubdtype(np.dtype(_dtype_of(layer)), np.integer):
        raise ValueError(f"{_WHO}: layer must be an integer scalar (a Python int or an int32 0-d array, traced or "
                         f"not), got {_describe(layer)}")
    if _concrete(layer):
        n = int(np.asarray(layer))
        if not 0 <= n < layers:
            raise ValueError(f"{_WHO}: layer must be in [0, {layers}) for caches stacked over {layers} layers, got {n}")
        layer = jnp.asarray(n, jnp.int32)
    else:
        layer = jnp.clip(as_int32(layer), 0, layers - 1).reshape(())
    return layer, *(jax.ShapeDtypeStruct(c.shape[1:], c.dtype) for c in (k_cache, v_cache))


def check_out_proj(out_proj: Any, queries: Any, layers: int | None) -> None:
    """One ValueError naming what to fix, or None: out_proj must be [Hq x D, N] in the queries' dtype, or with
    layer= a stack [layers, Hq x D, N] over the caches' layers."""
    rows = queries.shape[1] * queries.shape[2]
    want = f"[{rows}, N]" if layers is None else f"[{layers}, {rows}, N] (stacked like the caches, read at layer)"
    shape = tuple(getattr(out_proj, "shape", ()))
    lead = () if layers is None else (layers,)
    if len(shape) != len(lead) + 2 or shape[:-1] != (*lead, rows) or shape[-1] == 0:
        raise ValueError(f"{_WHO}: out_proj must be {want}: query heads x head dim rows, one column per output "
                         f"feature; got shape {shape}")
    if jnp.dtype(out_proj.dtype) != jnp.dtype(queries.dtype):
        raise ValueError(f"{_WHO}: out_proj must have the queries' dtype {jnp.dtype(queries.dtype).name}, got "
                         f"{jnp.dtype(out_proj.dtype).name}")


def _dtype_of(x: Any) -> Any:
    if isinstance(x, int):
        return np.int64
    dtype = getattr(x, "dtype", None)
    return np.asarray(x).dtype if dtype is None else dtype


def _describe(x: Any) -> str:
    dtype, shape = getattr(x, "dtype", None), getattr(x, "shape", None)
    return repr(x) if dtype is None else f"{dtype}{list(shape or ())}"


def check_num_seqs(num_seqs: Any, max_seqs: int) -> Any:
    """num_seqs as a Python int in [0, max_seqs] when concrete (2.5, NaN or a bool refused, never rounded); a traced
    one must be an integer scalar and is clamped by the implementations."""
    if num_seqs is None:
        return None
    if isinstance(num_seqs, jax.core.Tracer):
        if num_seqs.size != 1 or not np.issubdtype(np.dtype(num_seqs.dtype), np.integer):
            raise ValueError(f"{_WHO}: num_seqs must be an integer scalar, got {num_seqs.dtype}{list(num_seqs.shape)}")
        return num_seqs
    if getattr(num_seqs, "ndim", 0) == 1 and num_seqs.shape == (1,):
        num_seqs = num_seqs[0]
    return int_arg(_WHO, "num_seqs", num_seqs, low=0, high=max_seqs)


def check_paged_values(kv_lens, page_indices, cu_q_lens, num_seqs, sh: PagedShapes) -> None:
    """ValueError for a page table or lengths that would read or write outside the cache; nothing when any of them
    is traced (the kernel clamps instead)."""
    if not all(_concrete(x) for x in (kv_lens, page_indices, cu_q_lens)) or (
            num_seqs is not None and not _concrete(num_seqs)):
        return
    n = sh.max_seqs if num_seqs is None else int(num_seqs)
    lens, table = _host_ints("kv_lens", kv_lens)[:n], _host_ints("page_indices", page_indices)[:n]
    cu = _host_ints("cu_q_lens", cu_q_lens)[:n + 1]
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
    _check_distinct_writes(lens, table, steps, sh.page_size)


def _check_distinct_writes(lens: np.ndarray, table: np.ndarray, q_lens: np.ndarray, page_size: int) -> None:
    """ValueError when two new tokens (of two sequences, or one sequence listing a page twice) land on one page
    slot: which write wins would be unspecified. Pages shared for reading (a common prefix) are fine."""
    seq = np.repeat(np.arange(len(q_lens)), q_lens)
    if not seq.size:
        return
    first = np.repeat(np.cumsum(q_lens) - q_lens, q_lens)
    pos = (lens - q_lens)[seq] + np.arange(seq.size) - first
    slot = table[seq, pos // page_size] * page_size + pos % page_size
    order = np.argsort(slot, kind="stable")
    same = np.flatnonzero(slot[order][1:] == slot[order][:-1])
    if same.size:
        a, b = (int(x) for x in order[same[0]:same[0] + 2])
        page, row = divmod(int(slot[a]), page_size)
        raise ValueError(f"ragged_paged_attention: sequences {int(seq[a])} and {int(seq[b])} both write page {page} "
                         f"row {row} (positions {int(pos[a])} and {int(pos[b])}); a page this call writes must belong "
                         "to one sequence (pages shared for reading are fine)")
