"""What every ragged paged attention implementation shares: the clamped metadata, the cache update and the work list.

Work items: each sequence's new tokens cut into blocks of `block_q` tokens, one work item per block, packed back to
back (at most min(T, (T + S (block_q - 1)) // block_q) of them: a static count). A work item holds its tokens' queries
for every kv head as rows token-major, head-minor ([Hkv, block_q * G, D]), so the G query heads sharing a kv head
and all the block's tokens are the rows of one matrix; `qpos` gives each row's position in its sequence (-1: no
token) and `lo`/`hi` the cache positions the item attends, so an implementation reads only those pages.

Traced metadata is made safe here: lengths clipped to the pages given, page ids clipped into the cache for reads,
and writes aimed at an invalid page dropped, so nothing reads or writes outside the cache.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from .paged_checks import PagedShapes
from .paged_quant import quantize_rows


@dataclasses.dataclass(frozen=True)
class Meta:
    """Per-sequence metadata, clamped (sequences at or past num_seqs have no tokens)."""

    q_start: jax.Array  # [S] first row of each sequence in the packed tokens
    q_len: jax.Array  # [S]
    kv_len: jax.Array  # [S] clipped to [q_len, pages_per_seq * page_size]
    table: jax.Array  # [S, pages_per_seq] page ids as given (writes check them)
    read_table: jax.Array  # [S, pages_per_seq] page ids clipped into the cache (reads)
    num_valid_tokens: jax.Array  # scalar: cu_q_lens[num_seqs]


def metadata(kv_lens, page_indices, cu_q_lens, num_seqs, sh: PagedShapes) -> Meta:
    s = sh.max_seqs
    n = jnp.clip(jnp.asarray(s if num_seqs is None else num_seqs, jnp.int32).reshape(()), 0, s)
    cu = jax.lax.cummax(jnp.clip(jnp.asarray(cu_q_lens, jnp.int32), 0, sh.tokens))
    cu = jnp.where(jnp.arange(s + 1) <= n, cu, cu[n])
    q_len = cu[1:] - cu[:-1]
    cap = sh.pages_per_seq * sh.page_size
    kv_len = jnp.clip(jnp.asarray(kv_lens, jnp.int32), 0, cap)
    q_len = jnp.minimum(q_len, kv_len)  # a sequence with more new tokens than positions keeps only what fits
    table = jnp.asarray(page_indices, jnp.int32)
    return Meta(cu[:-1], q_len, kv_len, table, jnp.clip(table, 0, sh.num_pages - 1), cu[n])


def token_slots(meta: Meta, sh: PagedShapes) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(sequence, row within it, valid) of each packed token row."""
    t = jnp.arange(sh.tokens, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(meta.q_start + meta.q_len, t, side="right"), 0, sh.max_seqs - 1)
    row = t - meta.q_start[seq]
    valid = (t < meta.num_valid_tokens) & (row >= 0) & (row < meta.q_len[seq])
    return seq.astype(jnp.int32), row, valid


def token_destinations(meta: Meta, sh: PagedShapes) -> tuple[jax.Array, jax.Array]:
    """(page, slot) [T] int32 of each packed token row's K/V; page -1 where nothing is written (padding, a position
    past the pages given, a page id outside the cache)."""
    seq, row, valid = token_slots(meta, sh)
    pos = meta.kv_len[seq] - meta.q_len[seq] + row
    slot_of_page = jnp.clip(pos // sh.page_size, 0, sh.pages_per_seq - 1)
    page = meta.table[seq, slot_of_page]
    ok = valid & (pos >= 0) & (pos // sh.page_size < sh.pages_per_seq) & (page >= 0) & (page < sh.num_pages)
    return jnp.where(ok, page, -1).astype(jnp.int32), (pos % sh.page_size).astype(jnp.int32)


def max_write_runs(sh: PagedShapes) -> int:
    """A static bound on the runs (pallas_paged_write.row_runs) token_destinations' rows form: a sequence's q new
    tokens are q consecutive positions, so its valid rows cross at most q // page_size + 2 pages and make at most
    that many runs (the clamped metadata keeps each sequence's rows one interval); summed, T // page_size + 2 S."""
    return max(1, min(sh.tokens, sh.tokens // sh.page_size + 2 * sh.max_seqs))


def write_new_tokens(k_cache, v_cache, keys, values, meta: Meta, sh: PagedShapes, layer=None):
    """The caches with each valid token's K/V at its page and slot (an XLA scatter), quantized for an fp8 cache; a
    write aimed outside the cache is dropped. With `layer`, the caches are stacked over layers and the rows go to
    [layer, page, slot] (one scatter into the stack: no layer is sliced out)."""
    page, slot = token_destinations(meta, sh)
    page = jnp.where(page >= 0, page, sh.num_pages)  # out of bounds: dropped
    at = (page, slot) if layer is None else (layer, page, slot)
    k_cache = k_cache.at[at].set(quantize_rows(keys, k_cache.dtype, sh.k_scale), mode="drop")
    v_cache = v_cache.at[at].set(quantize_rows(values, v_cache.dtype, sh.v_scale), mode="drop")
    return k_cache, v_cache


def num_work_items(sh: PagedShapes, block_q: int) -> int:
    return max(1, min(sh.tokens, (sh.tokens + sh.max_seqs * (block_q - 1)) // block_q))


@dataclasses.dataclass(frozen=True)
class Work:
    seq: jax.Array  # [W] int32 sequence of each work item
    lo: jax.Array  # [W] first cache position any of its rows attends
    hi: jax.Array  # [W] last one (hi < lo: nothing to do)
    qpos: jax.Array  # [W, block_q] position of each token in its sequence, -1 for none
    token: jax.Array  # [W, block_q] packed row of each token (clipped)


def _blocks(meta: Meta, block_q: int, select: jax.Array | None) -> jax.Array:
    blocks = (meta.q_len + block_q - 1) // block_q
    return blocks if select is None else jnp.where(select, blocks, 0)


def work_items(meta: Meta, sh: PagedShapes, block_q: int, causal: bool, select: jax.Array | None = None,
               count: int | None = None) -> Work:
    """The work items of the sequences `select` [S] marks (all when None); `count` of them (static; default
    num_work_items, enough for any batch)."""
    w_count = count or num_work_items(sh, block_q)
    blocks = _blocks(meta, block_q, select)
    ends = jnp.cumsum(blocks)
    starts = ends - blocks
    w = jnp.arange(w_count, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(ends, w, side="right"), 0, sh.max_seqs - 1).astype(jnp.int32)
    live = w < ends[-1]
    row0 = (w - starts[seq]) * block_q
    q_len, kv_len = meta.q_len[seq], meta.kv_len[seq]
    rows = row0[:, None] + jnp.arange(block_q, dtype=jnp.int32)[None, :]
    has = live[:, None] & (rows < q_len[:, None])
    qpos = jnp.where(has, (kv_len - q_len)[:, None] + rows, -1)
    token = jnp.clip(meta.q_start[seq][:, None] + rows, 0, sh.tokens - 1)
    first = kv_len - q_len + row0
    last = kv_len - q_len + jnp.minimum(row0 + block_q, q_len) - 1
    lo = jnp.zeros_like(first) if sh.window is None else jnp.maximum(first - sh.window + 1, 0)
    hi = jnp.minimum(last, kv_len - 1) if causal else kv_len - 1
    hi = jnp.where(live & (q_len > 0), hi, -1)
    return Work(seq, lo, hi, qpos, token)


def token_work(meta: Meta, sh: PagedShapes, causal: bool) -> Work:
    """One work item per packed token row (item t = row t, padding rows hold nothing to do): the decode schedule,
    whose kernel reads the queries and writes the output where they lie, with no regrouping outside it."""
    seq, row, valid = token_slots(meta, sh)
    q_len, kv_len = meta.q_len[seq], meta.kv_len[seq]
    pos = kv_len - q_len + row
    qpos = jnp.where(valid, pos, -1)
    lo = jnp.zeros_like(pos) if sh.window is None else jnp.maximum(pos - sh.window + 1, 0)
    hi = jnp.minimum(pos, kv_len - 1) if causal else kv_len - 1
    hi = jnp.where(valid, hi, -1)
    return Work(seq, lo, hi, qpos[:, None], jnp.arange(sh.tokens, dtype=jnp.int32)[:, None])


def item_rows(work: Work) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(first packed row, rows, position of the first row) [W] int32 of each work item: the packed rows it reads its
    queries from and writes its output to, in place (an item's rows are consecutive; no two items share one; an item
    with no rows, 0, reads and writes nothing)."""
    rows = jnp.sum(work.qpos >= 0, axis=1).astype(jnp.int32)
    return work.token[:, 0], rows, jnp.maximum(work.qpos[:, 0], 0)


def gather_queries(queries, work: Work, sh: PagedShapes) -> jax.Array:
    """[W, Hkv, block_q * G, D]: each work item's queries, rows token-major then query head within the group."""
    w_count, bq = work.token.shape
    q = queries[work.token]  # [W, bq, Hq, D]; rows of no token hold some other token's query, and see no key
    q = q.reshape(w_count, bq, sh.kv_heads, sh.group, sh.head_dim).transpose(0, 2, 1, 3, 4)
    return q.reshape(w_count, sh.kv_heads, bq * sh.group, sh.head_dim)


def row_positions(work: Work, sh: PagedShapes) -> jax.Array:
    """[W, block_q * G]: the sequence position of every row of gather_queries' layout."""
    return jnp.repeat(work.qpos, sh.group, axis=1)


def scatter_outputs(out_work: jax.Array, meta: Meta, sh: PagedShapes, block_q: int,
                    select: jax.Array | None = None) -> jax.Array:
    """[T, Hq, D] from the work items' [W, Hkv, block_q * G, D]; padding rows and unselected sequences' rows 0."""
    w_count = out_work.shape[0]
    out = out_work.reshape(w_count, sh.kv_heads, block_q, sh.group, sh.head_dim).transpose(0, 2, 1, 3, 4)
    out = out.reshape(w_count * block_q, sh.q_heads, sh.head_dim)
    seq, row, valid = token_slots(meta, sh)
    if select is not None:
        valid &= select[seq]
    blocks = _blocks(meta, block_q, select)
    first_item = jnp.cumsum(blocks) - blocks
    flat = (first_item[seq] + row // block_q) * block_q + row % block_q
    got = out[jnp.clip(flat, 0, w_count * block_q - 1)]
    return jnp.where(valid[:, None, None], got, 0).astype(out_work.dtype)
