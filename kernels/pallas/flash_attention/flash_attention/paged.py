"""Ragged paged attention: the JAX entry (one dispatch with flash_attention and decode_attention).

Implementations: "pallas" (pallas_paged.py: compiled on a TPU, interpreted elsewhere; one attention call for any mix
of decode steps and prefill chunks, its work items reading their query rows and writing their output rows where they
lie in the packed arrays, so nothing is regrouped outside the kernel), "cpu" (paged_cpu.cpu_paged:
XLA walking the page table a block at a time, the fast path on CPU) and "xla" (paged_cpu.xla_paged: gather every
page, then attend; portable). All three write the new tokens' K/V into their pages first: "pallas" with a Pallas
kernel whose cache outputs alias its inputs (pallas_paged_write), so under a jit that donates the caches the update
happens in place and no copy of a cache exists anywhere in the program; "cpu" and "xla" with an XLA scatter
(paged_layout.write_new_tokens), in place on XLA's CPU backend under donation too.

With `layer=`, the caches are stacks over layers ([L, pages, page_size, Hkv, D]) and the call reads and writes
layer `layer` of them in place (the Pallas kernels index their page DMAs by it; the XLA paths scatter and gather at
[layer, ...]): a decode step's scan over layers carries the whole stacks, and no layer is ever sliced out of them or
written back.

The caches may be float8_e4m3fn with per-cache scales (k_scale, v_scale; paged_quant.py): new rows are quantized on
store, pages dequantized where they are read, the same way by every implementation; chips without fp8 refuse them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from ._vendor.chips import chip_for_device_kind
from ._vendor.interpret import resolve_interpret, run_dispatch
from ._vendor.platform import platform_of
from .api import _DISPATCH, _vmem
from .config import AttentionConfig, cdiv, device_kind_of, fold_out_proj
from .paged_checks import (
    PagedShapes,
    as_int32,
    check_layer,
    check_num_seqs,
    check_out_proj,
    check_paged_shapes,
    check_paged_values,
    host_or_traced,
)
from .paged_cpu import cpu_paged, xla_paged
from .paged_layout import (
    gather_queries,
    item_rows,
    max_write_runs,
    metadata,
    row_positions,
    scatter_outputs,
    token_destinations,
    token_slots,
    token_work,
    work_items,
    write_new_tokens,
)
from .paged_quant import fp8_refusal, is_fp8, quantize_rows
from .paged_tuning import Choice, choose_blocks
from .pallas_paged import ItemRows, NewRows, PagedStatic, layout_ok, paged_forward, paged_mixed_forward
from .pallas_paged_write import write_pages

#: The blocks the last call chose (what the compile gate records per case).
_LAST_BLOCKS: list[Choice | None] = [None]


def last_tuning(clear: bool = False) -> str | None:
    """"block_q B, P pages per step, I items per step (source)" of the last ragged_paged_attention call in this
    process (None: none since the last clear); `clear` forgets it after reading (the compile gate records it per
    case)."""
    c = _LAST_BLOCKS[0]
    if clear:
        _LAST_BLOCKS[0] = None
    return None if c is None else (f"block_q {c.block_q}, {c.pages_per_block} pages per step, {c.items} items per "
                                   f"step ({c.source})")


def _steps(sh: PagedShapes, block_q: int, ppb: int) -> int:
    """kv steps per work item: every block of a sequence's pages, or, with a window, as many blocks as the window
    plus the item's own tokens span from the page holding its first position (the steps start there)."""
    steps = cdiv(sh.pages_per_seq, ppb)
    if sh.window is not None:
        span = sh.window + block_q - 1 + sh.page_size - 1
        steps = min(steps, cdiv(span, ppb * sh.page_size))
    return steps


@functools.partial(jax.jit, static_argnames=("impl", "sh", "causal", "block_q", "ppb", "interpret", "vmem_limit",
                                             "update_cache", "sub_q", "items", "fold"))
def _paged(queries, keys, values, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, num_seqs, sinks, layer,
           out_proj=None, *, impl, sh: PagedShapes, causal, block_q, ppb, interpret, vmem_limit, update_cache, sub_q=0,
           items=1, fold=False):
    out, k_cache, v_cache = _attend_paged(queries, keys, values, k_cache, v_cache, kv_lens, page_indices, cu_q_lens,
                                          num_seqs, sinks, layer, out_proj if fold else None, impl=impl, sh=sh,
                                          causal=causal, block_q=block_q, ppb=ppb, interpret=interpret,
                                          vmem_limit=vmem_limit, update_cache=update_cache, sub_q=sub_q, items=items)
    if out_proj is not None and not fold:
        out = project_out(out, out_proj, layer)
    return out, k_cache, v_cache


def project_out(out: jax.Array, out_proj: jax.Array, layer: jax.Array | None) -> jax.Array:
    """[T, N]: out [T, Hq, D] (as the call stores it, in its dtype) times out_proj [Hq x D, N] (or the stack's
    layer `layer`), accumulated in f32: what the kernel computes when the projection is folded in."""
    w = out_proj if out_proj.ndim == 2 else jax.lax.dynamic_index_in_dim(out_proj, layer, keepdims=False)
    precision = jax.lax.Precision.HIGHEST if out.dtype == jnp.float32 else None
    y = jax.lax.dot_general(out.reshape(out.shape[0], -1), w, (((1,), (0,)), ((), ())), precision=precision,
                            preferred_element_type=jnp.float32)
    return y.astype(out.dtype)


def _attend_paged(queries, keys, values, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, num_seqs, sinks, layer,
                  out_proj, *, impl, sh: PagedShapes, causal, block_q, ppb, interpret, vmem_limit, update_cache,
                  sub_q, items):
    """(out, k_cache, v_cache) of one implementation; `out_proj` (the decode schedule's Pallas kernel only): the
    output already projected."""
    meta = metadata(kv_lens, page_indices, cu_q_lens, num_seqs, sh)
    if impl == "pallas" and block_q == 1:  # the decode schedule: queries and output where they lie
        work = token_work(meta, sh, causal)
        st = _static(sh, sinks is not None, causal, ppb, _steps(sh, 1, ppb), interpret, vmem_limit, direct=True,
                     write=update_cache, items=items, project=out_proj is not None)
        args = (queries, row_positions(work, sh), _sinks_rows(sinks, sh, 1), k_cache, v_cache, work.seq, work.lo,
                work.hi, meta.kv_len, meta.read_table, st, layer)
        if not update_cache:
            return paged_forward(*args, out_proj=out_proj), k_cache, v_cache
        page, slot = token_destinations(meta, sh)  # the kernel stores the new rows itself: one call
        new = NewRows(quantize_rows(keys, k_cache.dtype, sh.k_scale), quantize_rows(values, v_cache.dtype, sh.v_scale),
                      page, slot, meta.q_start, meta.q_len)
        return paged_forward(*args, new=new, out_proj=out_proj)
    if impl == "pallas":  # any mix: one attention call, queries and output where they lie
        work = work_items(meta, sh, block_q, causal)
        first, rows, pos = item_rows(work)
        st = _static(sh, sinks is not None, causal, ppb, _steps(sh, block_q, ppb), interpret, vmem_limit,
                     mixed_block_q=block_q, mixed_sub_q=sub_q, write=update_cache)
        new = None
        if update_cache:
            # decode steps' rows are stored by their own items (as on the decode schedule); the chunks' rows are
            # written first, in runs, so no item reads a row another item of the same call stores
            page, slot = token_destinations(meta, sh)
            one = meta.q_len[token_slots(meta, sh)[0]] == 1
            k_cache, v_cache = write_pages(k_cache, v_cache, keys, values, jnp.where(one, -1, page), slot,
                                           interpret=interpret, k_scale=sh.k_scale, v_scale=sh.v_scale, layer=layer,
                                           max_runs=max_write_runs(sh))
            row = jnp.clip(first, 0, sh.tokens - 1)
            new = ItemRows(quantize_rows(keys, k_cache.dtype, sh.k_scale),
                           quantize_rows(values, v_cache.dtype, sh.v_scale),
                           jnp.where((rows == 1) & one[row], page[row], -1), slot[row], row)
        out = paged_mixed_forward(queries, first, rows, pos, _sinks_rows(sinks, sh, block_q), k_cache, v_cache,
                                  work.seq, work.lo, work.hi, meta.kv_len, meta.read_table, st, layer, new=new)
        return (out, k_cache, v_cache) if new is None else out
    if update_cache:
        k_cache, v_cache = write_new_tokens(k_cache, v_cache, keys, values, meta, sh, layer)
    out = jnp.zeros(queries.shape, queries.dtype)
    for bq, select, count in _passes(meta, sh, block_q):
        work = work_items(meta, sh, bq, causal, select, count)
        out_work = _attend(impl, queries, work, k_cache, v_cache, meta, sinks, layer, sh=sh, causal=causal,
                           block_q=bq, ppb=ppb, interpret=interpret, vmem_limit=vmem_limit)
        out = out + scatter_outputs(out_work.astype(queries.dtype), meta, sh, bq, select)
    return out, k_cache, v_cache


def _passes(meta, sh: PagedShapes, block_q: int):
    """The "cpu" and "xla" implementations' passes (the pallas kernel takes any mix in one call, each item on its own
    rows): (tokens per work item, sequences, work items) per pass: decode steps (one new token) in items of one token,
    at most one per sequence, so their G heads are the rows and no row is padding; every other sequence in items of
    block_q tokens. One pass when block_q is 1."""
    if block_q == 1:
        return [(1, None, None)]
    one = meta.q_len == 1
    return [(1, one, min(sh.tokens, sh.max_seqs)), (block_q, ~one, None)]


def _attend(impl, queries, work, k_cache, v_cache, meta, sinks, layer, *, sh: PagedShapes, causal, block_q, ppb,
            interpret, vmem_limit):
    """[W, Hkv, block_q * G, D]: one pass's work items attended by implementation `impl`."""
    q_work = gather_queries(queries, work, sh)
    qpos = row_positions(work, sh)
    sinks_rows = None if sinks is None else _sinks_rows(sinks, sh, block_q)
    steps = _steps(sh, block_q, ppb)
    if impl == "cpu":
        return cpu_paged(q_work, qpos, work, k_cache, v_cache, meta, sh, causal=causal, sinks_rows=sinks_rows,
                         pages_per_block=ppb, steps=steps, layer=layer)
    if impl == "xla":
        return xla_paged(q_work, qpos, work, k_cache, v_cache, meta, sh, causal=causal, sinks_rows=sinks_rows,
                         layer=layer)
    st = _static(sh, sinks is not None, causal, ppb, steps, interpret, vmem_limit)
    snk = _sinks_rows(sinks, sh, block_q)
    return paged_forward(q_work, qpos, snk, k_cache, v_cache, work.seq, work.lo, work.hi, meta.kv_len,
                         meta.read_table, st, layer)


def _sinks_rows(sinks, sh: PagedShapes, block_q: int) -> jax.Array:
    """[Hkv, block_q * G] f32: each row's sink logit (zeros when there are none: the kernel then ignores them)."""
    if sinks is None:
        return jnp.zeros((sh.kv_heads, block_q * sh.group), jnp.float32)
    return jnp.tile(jnp.asarray(sinks, jnp.float32).reshape(sh.kv_heads, sh.group), (1, block_q))


def _static(sh: PagedShapes, has_sinks: bool, causal: bool, ppb: int, steps: int, interpret, vmem_limit, *,
            direct: bool = False, mixed_block_q: int = 0, write: bool = False, mixed_sub_q: int = 0,
            items: int = 1, project: bool = False) -> PagedStatic:
    return PagedStatic(sm_scale=sh.sm_scale, window=sh.window, soft_cap=sh.soft_cap, has_sinks=has_sinks,
                       causal=causal, page_size=sh.page_size, pages_per_block=ppb, pages_per_seq=sh.pages_per_seq,
                       num_pages=sh.num_pages, kv_heads=sh.kv_heads, steps=steps, interpret=interpret,
                       vmem_limit_bytes=vmem_limit, group=sh.group, direct=direct, k_scale=sh.k_scale,
                       v_scale=sh.v_scale, mixed_block_q=mixed_block_q, write=write, mixed_sub_q=mixed_sub_q,
                       items=items, project=project)


def ragged_paged_attention(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: int | jax.Array | None = None,
    *,
    layer: int | jax.Array | None = None,
    sinks: jax.Array | None = None,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    causal: bool = True,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
    config: AttentionConfig | None = None,
    update_cache: bool = True,
    k_scale: float | None = None,
    v_scale: float | None = None,
    out_proj: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Attention of many sequences' new tokens, packed ragged, over a paged KV cache; prefill chunks and decode steps
    mix in one call, and the new tokens' K/V are written into their pages as part of it.

    Args:
      queries: [T, Hq, D]; keys, values: [T, Hkv, D]. Sequence i owns rows cu_q_lens[i]:cu_q_lens[i+1]; rows past
        cu_q_lens[num_seqs] are padding (their output is 0, their K/V are not written).
      k_cache, v_cache: [num_pages, page_size, Hkv, D], the queries' dtype (float32 or bfloat16) or float8_e4m3fn
        (quantized: a stored x means x * k_scale, resp. v_scale; TPU v6e / v7x and CPU, refused on v4 / v5e / v5p).
      kv_lens: int32 [S], each sequence's length including its new tokens.
      page_indices: int32 [S, pages_per_seq]; position p of sequence i lives at page page_indices[i, p // page_size],
        slot p % page_size.
      cu_q_lens: int32 [S + 1]; num_seqs: sequences in use (int or int32 scalar; default S).
      layer: None (the caches are one layer's), or an integer scalar (an int, or an int32 0-d array, possibly traced:
        a scan's counter) with k_cache, v_cache stacked over layers, [L, num_pages, page_size, Hkv, D]: the call
        reads and writes layer `layer` of the stacks in place and returns the whole stacks, every other layer as it
        was. A concrete layer outside [0, L) is refused; a traced one is clamped into the stack.
      sinks: optional [Hq] f32 logits that join each head's softmax denominator; sm_scale: default 1/sqrt(D);
        sliding_window: query at position p sees positions > p - window; soft_cap: tanh cap on the logits; causal:
        query j of sequence i sits at position kv_lens[i] - q_len + j and sees positions up to its own.
      implementation / interpret / config: the kernel contract (docs/kernel-contract.md); config's paged_* fields
        override the block choice.
      update_cache: False when the caller has written the new rows into the caches already (the torch entries, which
        update transformers' cache tensors in place): keys/values are then not written and the caches come back as
        given, so a caller that does not donate them pays no copy.
      k_scale, v_scale: an fp8 cache's per-cache scales, static Python numbers > 0 (default 1.0); new rows are stored
        as clip(x / scale, +-448) in e4m3 (saturating). Refused with a float cache unless 1.0.
      out_proj: optional [Hq x D, N] output projection in the queries' dtype (with layer=, a stack [L, Hq x D, N]
        read at the layer): the output is then out [T, Hq x D] @ out_proj, [T, N] (an attention layer's o_proj; under
        tensor parallelism, each device's heads' rows, summed across devices by the caller). On the decode schedule
        the Pallas kernel multiplies in its last grid step when rows, weight and output fit a quarter of the VMEM
        budget (config.fold_out_proj), so the projection is no op of its own; elsewhere it is one XLA dot after.

    Returns:
      (out [T, Hq, D] (with out_proj: [T, N]) in queries.dtype, k_cache, v_cache) with the new rows written (with
      `layer`: the whole stacks).
      The caller rebinds the returned caches (as vLLM does): under `jax.jit(step, donate_argnums=...)` donating both
      caches they are the same buffers, updated in place; a caller that does not donate gets one copy of each
      (docs/paged-attention.md). A scan over layers carries the stacks and rebinds them each layer.

    Concrete metadata is checked in the dtype given (one ValueError: a page id outside the cache, kv_lens past the
    pages given, more new tokens than kv_lens, cu_q_lens decreasing, two new tokens on one page slot, num_seqs not an
    integer); traced metadata is clamped so nothing is read or written outside the cache (paged_checks.py says what a
    jit boundary does to int64). No tokens (or no sequences): zeros and the caches unchanged.
    """
    queries, keys, values = jnp.asarray(queries), jnp.asarray(keys), jnp.asarray(values)
    k_cache, v_cache = jnp.asarray(k_cache), jnp.asarray(v_cache)
    kv_lens, page_indices, cu_q_lens = (host_or_traced(x) for x in (kv_lens, page_indices, cu_q_lens))
    one_k, one_v = k_cache, v_cache  # what one layer's caches look like (the checks' view)
    if layer is not None:
        layer, one_k, one_v = check_layer(layer, k_cache, v_cache)
    sh = check_paged_shapes(queries, keys, values, one_k, one_v, kv_lens, page_indices, cu_q_lens, sinks,
                            sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
                            k_scale=k_scale, v_scale=v_scale)
    if is_fp8(k_cache.dtype):
        why = fp8_refusal(device_kind_of(k_cache))
        if why:
            raise ValueError(why)
    if out_proj is not None:
        out_proj = jnp.asarray(out_proj)
        check_out_proj(out_proj, queries, None if layer is None else k_cache.shape[0])
    num_seqs = check_num_seqs(num_seqs, sh.max_seqs)
    check_paged_values(kv_lens, page_indices, cu_q_lens, num_seqs, sh)
    if sh.tokens == 0 or sh.max_seqs == 0:  # nothing to attend or write
        shape = queries.shape if out_proj is None else (sh.tokens, out_proj.shape[-1])
        return jnp.zeros(shape, queries.dtype), k_cache, v_cache
    kv_lens, page_indices, cu_q_lens = (as_int32(x) for x in (kv_lens, page_indices, cu_q_lens))
    num = as_int32(jnp.asarray(sh.max_seqs if num_seqs is None else num_seqs)).reshape(())
    cfg = config or AttentionConfig()
    vmem = _vmem(k_cache)
    interpreted = resolve_interpret(interpret, platform_of(queries, k_cache, v_cache)) is not False
    choice = choose_blocks(sh, jnp.dtype(queries.dtype).name, jnp.dtype(k_cache.dtype).name,
                           jnp.dtype(k_cache.dtype).itemsize, device_kind_of(k_cache), vmem["vmem_budget_bytes"], cfg,
                           interpreted=interpreted)
    _LAST_BLOCKS[0] = choice
    block_q, ppb = choice.block_q, choice.pages_per_block
    # the CPU walk holds a block of pages per work item at once: 256 positions keep that a small slice of the cache
    cpu_ppb = min(cfg.paged_pages_per_block or max(1, 256 // sh.page_size), sh.pages_per_seq)

    chip = chip_for_device_kind(device_kind_of(k_cache))
    fold = out_proj is not None and block_q == 1 and fold_out_proj(
        -(-sh.tokens // choice.items) * choice.items, sh.q_heads, sh.head_dim, out_proj.shape[-1],
        jnp.dtype(queries.dtype).itemsize, vmem["vmem_budget_bytes"], None if chip is None else chip.name)[0]

    def run(impl: str, mode: Any):
        if impl == "pallas":
            why = layout_ok(sh.head_dim, sh.page_size, k_cache.dtype)
            if why:
                raise NotImplementedError(f"the paged attention kernel cannot take this cache: {why}")
        return _paged(queries, keys, values, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, num, sinks, layer,
                      out_proj, fold=fold and impl == "pallas", impl=impl, sh=sh, causal=bool(causal), block_q=block_q,
                      ppb=cpu_ppb if impl == "cpu" else ppb, interpret=mode,
                      vmem_limit=vmem["vmem_limit_bytes"], update_cache=bool(update_cache), sub_q=choice.sub_q,
                      items=choice.items)

    return run_dispatch(_DISPATCH, implementation, interpret, (queries, k_cache, v_cache), run,
                        "the ragged paged attention kernel")
