"""Pallas TPU ragged paged attention: the work items of paged_layout against a paged KV cache.

Grid (work items, kv blocks). The scalar-prefetched metadata (each item's sequence and cache range, the lengths, the
flattened page table) drives manual DMAs: a step copies `pages_per_block` pages of K and of V, every kv head at once,
from HBM into VMEM, so each page is read once per work item whatever the number of heads; the step after prefetches
the next block's pages while this one computes (double buffering across the kv axis of one work item). Steps past an
item's range issue no DMA and do no work; a sliding window's first step is the block holding the window's first
position, so a windowed layer reads only the pages its window reaches. The kernel takes each cache in the caller's
own [pages, page_size, Hkv, D] layout, whole pages copied as they lie (any reshape XLA cannot make a bitcast would
copy the whole cache before the call), and reads kv head h as the [block, D] slice buf[:, h, :]; the G query heads
of that kv head and the item's tokens are the rows of one [block_q * G, D] matrix, and an online softmax folds the
blocks in (each block in chunks of kv_compute columns, one loop body: the compiled code does not grow with
the pages a step copies, and a chunk wholly past the item's reach is skipped).

Mixed batches (paged_mixed_forward) run as one call: the packed queries stay in HBM and each work item copies its
own rows (at most block_q consecutive tokens of one sequence) into VMEM by its first row and row count, both
scalar-prefetched, then copies its output rows back to the same rows of the output, which starts as zeros (padding
rows stay 0). Items never share a row, so they run in any order, on either core. An item of one token (a decode step,
or a chunk's one-token tail) computes on its G heads only; a longer one on block_q * G rows. Copies have static sizes:
a row count short of block_q goes as powers of two. A kv block every real row of an item sees whole is folded
without masks. With the cache updated (paged_mixed_forward's `new`), an item whose sequence has one new token (a
decode step) stores its own row as the decode schedule does (ItemRows); the chunks' rows are written before the call.

A block's pages past the last position the item sees are not read (a reach of 10 pages in blocks of 8 reads 10);
their slots keep whatever the buffer held. Page reads are clamped: a page id outside the cache reads page 0 or the
last one. The mask keeps unseen columns out, and values past the item's last position are zeroed before they meet the
probabilities, so stale, unread or NaN contents never reach the output.

Caches stacked over layers ([L, pages, page_size, Hkv, D]) are read in place: the layer is one more
scalar-prefetched operand and each page DMA reads [layer, page], so no layer is sliced out of the stack.

An fp8 cache (float8_e4m3fn, paged_quant.py) is copied as it lies (half a bf16 cache's bytes) and each head's slice
cast to the queries' dtype in VMEM; k_scale multiplies the logits with sm_scale and v_scale the finished rows.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .config import KV_COMPUTE, LANES, MIXED_SUB_Q
from .pallas_flash import MASKED, _dot, finish_softmax, online_softmax_step


@dataclasses.dataclass(frozen=True)
class PagedStatic:
    sm_scale: float
    window: int | None
    soft_cap: float | None
    has_sinks: bool
    causal: bool
    page_size: int
    pages_per_block: int
    pages_per_seq: int
    num_pages: int
    kv_heads: int
    steps: int
    interpret: Any = False
    vmem_limit_bytes: int | None = None
    group: int = 1  # query heads per kv head
    direct: bool = False  # one token per item, item w = packed row w: queries and output read and written in place
    mixed_block_q: int = 0  # > 0: items of up to this many tokens read their query rows and write their output rows
    #                         where they lie in the packed [T, Hq, D] arrays (paged_mixed_forward)
    k_scale: float = 1.0  # an fp8 cache's dequantization scales (1.0 for a float cache)
    v_scale: float = 1.0
    write: bool = False  # direct: each item stores its own token's new K/V in its page (NewRows), caches aliased
    mixed_sub_q: int = 0  # tokens a mixed item computes at a time (paged_tuning.Choice.sub_q); 0: the default
    items: int = 1  # direct: work items per grid step (each its own buffers; paged_tuning.decode_items)
    project: bool = False  # direct: the output projection folded in (paged_forward's out_proj; grid in order)

    @property
    def sub_q(self) -> int:
        """Tokens a mixed item computes at a time: its rows run in sub-blocks of this many tokens, as many as it
        has, each over the same kv block (a chunk's tail and a short chunk compute only the sub-blocks they fill,
        while every kv block is still read once per item of up to mixed_block_q tokens)."""
        if not self.mixed_block_q:
            return 0
        return min(self.mixed_block_q, self.mixed_sub_q or MIXED_SUB_Q)

    @property
    def sub_blocks(self) -> int:
        return -(-self.mixed_block_q // self.sub_q) if self.mixed_block_q else 0

    @property
    def block_kv(self) -> int:
        return self.pages_per_block * self.page_size

    @property
    def kv_compute(self) -> int:
        """Cache positions computed at a time inside a kv block: the block in as few equal chunks of at most
        KV_COMPUTE columns as divide it into whole 128-lane columns (1152 positions: 3 of 384), else whole."""
        n = self.block_kv
        if n <= KV_COMPUTE:
            return n
        for chunks in range(-(-n // KV_COMPUTE), n // LANES + 1):
            if n % chunks == 0 and (n // chunks) % LANES == 0:
                return n // chunks
        return n


def layout_ok(head_dim: int, page_size: int, dtype: Any) -> str | None:
    """Why the kernel cannot take this cache, or None: a page must fill whole sublane tiles (8 rows of 32 bits) and
    each head whole 128-lane columns."""
    rows = 8 * (4 // jnp.dtype(dtype).itemsize)
    if page_size % rows:
        return f"page_size {page_size} is not a multiple of {rows} (whole {jnp.dtype(dtype).name} sublane tiles)"
    if head_dim % LANES:
        return f"head_dim {head_dim} is not a multiple of {LANES} (each head whole lane columns)"
    return None


@dataclasses.dataclass(frozen=True)
class NewRows:
    """The new tokens' K/V for a direct call that stores them itself (PagedStatic.write): one row per packed token,
    where it goes, and which rows each sequence owns (to patch rows another item stores into the pages read)."""

    keys: jax.Array  # [T, Hkv, D] in the cache's dtype (quantized as stored)
    values: jax.Array
    page: jax.Array  # [T] int32 destination page, -1: not stored (padding, outside the cache)
    slot: jax.Array  # [T] int32 slot in that page
    q_start: jax.Array  # [S] int32 first packed row of each sequence
    q_len: jax.Array  # [S] int32 its new tokens


@dataclasses.dataclass(frozen=True)
class ItemRows:
    """The new rows a mixed call stores itself: the one row of each item whose sequence has one new token (a decode
    step); every other new row was written before the call (pallas_paged_write), so no item reads a row another item
    stores in the same call."""

    keys: jax.Array  # [T, Hkv, D] in the cache's dtype (quantized as stored)
    values: jax.Array
    page: jax.Array  # [W] int32 destination page of item w's row, -1: the item stores nothing
    slot: jax.Array  # [W] int32 slot in that page
    row: jax.Array  # [W] int32 packed row of item w's token (in range even where page is -1)


#: Each variant's kernel operands after the scalar-prefetched ones, in order (inputs, outputs, scratch).
_OPERANDS = {
    "mixed_write": ("first", "rows", "pos", "page", "slot", "row", "q", "sinks", "knew", "vnew", "k_hbm", "v_hbm",
                    "zeros", "o", "k_out", "v_out", "kbuf", "vbuf", "sems", "m", "l", "acc", "qbuf", "obuf",
                    "row_sems", "wsems", "started"),
    "mixed": ("first", "rows", "pos", "q", "sinks", "k_hbm", "v_hbm", "zeros", "o", "kbuf", "vbuf", "sems", "m", "l",
              "acc", "qbuf", "obuf", "row_sems"),
    "write": ("page", "slot", "qstart", "qlen", "q", "qpos", "sinks", "knew", "vnew", "keys_hbm", "values_hbm",
              "k_hbm", "v_hbm", "o", "k_out", "v_out", "kbuf", "vbuf", "sems", "m", "l", "acc", "wsems", "psems",
              "started"),
    "plain": ("q", "qpos", "sinks", "k_hbm", "v_hbm", "o", "kbuf", "vbuf", "sems", "m", "l", "acc"),
}
#: A direct call's operands with one slice per work item of the grid step (PagedStatic.items): indexed by the item
#: (its own block, buffers and semaphores), or sliced to one row where the body reads them as [1, ...].
_PER_ITEM = frozenset({"q", "qpos", "o", "kbuf", "vbuf", "sems", "m", "l", "acc", "wsems", "psems"})
_PER_ITEM_ROW = frozenset({"knew", "vnew", "started"})


def _variant(st: PagedStatic) -> str:
    if st.mixed_block_q:
        return "mixed_write" if st.write else "mixed"
    return "write" if st.write else "plain"


def _operand_names(st: PagedStatic) -> tuple[str, ...]:
    """The variant's operands; with the output projection folded in (st.project): its weight after the sinks, the
    projected output ("po", whole, in place of the per-item output) and the finished rows' scratch last."""
    names = list(_OPERANDS[_variant(st)])
    if not st.project:
        return tuple(names)
    names.insert(names.index("sinks") + 1, "wo")
    names[names.index("o")] = "po"
    return (*names, "rows")


def _project_rows(rows_ref, wo_ref, po_ref) -> None:
    """po = the finished rows [W, Hq, D] (each in the output's dtype, as an unprojected call stores them) times the
    projection [Hq x D, N], one query head's D rows of it at a time, accumulated in f32."""
    _, hq, d = rows_ref.shape
    precision = jax.lax.Precision.HIGHEST if po_ref.dtype == jnp.float32 else None
    acc = None
    for qh in range(hq):
        part = jax.lax.dot_general(rows_ref[:, qh, :].astype(wo_ref.dtype), wo_ref[pl.ds(qh * d, d), :],
                                   (((1,), (0,)), ((), ())), precision=precision,
                                   preferred_element_type=jnp.float32)
        acc = part if acc is None else acc + part
    po_ref[...] = acc.astype(po_ref.dtype)


def _kernel(seq_ref, lo_ref, hi_ref, kvlen_ref, table_ref, layer_ref, *refs, st: PagedStatic):
    """One grid step: its work item (or, direct with st.items > 1, its st.items items: every item's first pages
    are requested before any item computes, so one item's copies land while another computes, and a step's fixed
    cost is paid once for all of them)."""
    scalars = (seq_ref, lo_ref, hi_ref, kvlen_ref, table_ref, layer_ref)
    named = dict(zip(_operand_names(st), refs, strict=True))
    if st.items == 1:
        _item(pl.program_id(0), scalars, named, st, ("init", "step", "finish"))
    else:
        views = []
        for i in range(st.items):
            view = {k: r.at[i] if k in _PER_ITEM else r.at[pl.ds(i, 1)] if k in _PER_ITEM_ROW else r
                    for k, r in named.items()}
            views.append((pl.program_id(0) * st.items + i, view))
        for phase in ("init", "step", "finish"):
            for w, view in views:
                _item(w, scalars, view, st, (phase,))
    if st.project:  # every item's rows are in: the last grid step projects them all at once
        last = (pl.program_id(0) == pl.num_programs(0) - 1) & (pl.program_id(1) == pl.num_programs(1) - 1)
        pl.when(last)(lambda: _project_rows(named["rows"], named["wo"], named["po"]))


def _item(w, scalars, refs: dict, st: PagedStatic, phases: tuple[str, ...]):
    """Work item w's part of the grid step: "init" (its first kv step: clear the softmax rows, start the first
    block's copies), "step" (wait for kv step kj's pages, prefetch the next, fold them in), "finish" (its last kv
    step: write its output rows)."""
    seq_ref, lo_ref, hi_ref, kvlen_ref, table_ref, layer_ref = scalars
    r = refs.get
    first_ref, rows_ref, pos_ref, q_ref, qpos_ref, sinks_ref = r("first"), r("rows"), r("pos"), r("q"), r("qpos"), \
        r("sinks")
    k_hbm, v_hbm, o_ref, kbuf, vbuf, sems = r("k_hbm"), r("v_hbm"), r("o"), r("kbuf"), r("vbuf"), r("sems")
    m_scr, l_scr, acc_scr, qbuf, obuf, row_sems = r("m"), r("l"), r("acc"), r("qbuf"), r("obuf"), r("row_sems")
    new = None
    if st.write:
        new = _Store(r("page"), r("slot"), r("qstart"), r("qlen"), r("knew"), r("vnew"), r("keys_hbm"),
                     r("values_hbm"), r("k_out"), r("v_out"), r("wsems"), r("psems"), r("started"))
    kj = pl.program_id(1)
    n, ps, ppb, hkv = st.block_kv, st.page_size, st.pages_per_block, st.kv_heads

    def start_of(step):
        """First cache position of kv step `step`: steps begin at the page holding the item's first position."""
        return jnp.maximum(lo_ref[w], 0) // ps * ps + step * n

    def active(step):
        return (hi_ref[w] >= lo_ref[w]) & (start_of(step) <= hi_ref[w]) & (step < st.steps)

    def block_copies(step, slot, *, wait: bool) -> None:
        """Start (or wait for) the page copies of kv step `step` into buffer `slot`: only pages holding a position
        the item sees (up to hi); the block's other slots keep stale values, which the mask and the value zeroing
        keep out (a 10-page reach in blocks of 8 reads 10 pages, not 16)."""
        seq = seq_ref[w]
        kv_len = kvlen_ref[seq]
        last = jnp.maximum((kv_len + ps - 1) // ps - 1, 0)
        for j in range(ppb):
            def page_copies(j=j):
                page_slot = jnp.minimum(start_of(step) // ps + j, last)
                page = jnp.clip(table_ref[seq * st.pages_per_seq + page_slot], 0, st.num_pages - 1)
                dst = pl.ds(j * ps, ps)
                at = (layer_ref[0], page) if k_hbm.ndim == 5 else (page,)
                for src, buf, i in ((k_hbm, kbuf, 0), (v_hbm, vbuf, 1)):
                    c = pltpu.make_async_copy(src.at[at], buf.at[slot, dst], sems.at[i, slot])
                    c.wait() if wait else c.start()

            if j == 0:  # an active step's first page always holds a seen position
                page_copies()
            else:
                pl.when(start_of(step) + j * ps <= hi_ref[w])(page_copies)

    slot = kj % 2
    g = st.group

    if "init" in phases:
        @pl.when(kj == 0)
        def _init():
            m_scr[...] = jnp.full(m_scr.shape, MASKED, jnp.float32)
            l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
            acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

            if new is not None:
                new.started[0] = 0

            @pl.when(active(0))
            def _first():
                block_copies(0, 0, wait=False)

            if st.mixed_block_q:  # the item's query rows, from where they lie in the packed queries
                for wait in (False, True):
                    _rows_copies(rows_ref[w], lambda off, size: pltpu.make_async_copy(
                        q_ref.at[pl.ds(first_ref[w] + off, size)], qbuf.at[pl.ds(off, size)], row_sems.at[0]),
                        st.mixed_block_q, wait=wait)

    def fold(q_of_head, qpos, rows, span=None):
        """One kv step of every kv head: `q_of_head(h)` [r, D] query rows at positions qpos [r, 1] (-1: none)
        into the scratch rows `rows` (an index tuple after the head: (slice,) or, mixed, (sub-block, slice)).
        `span` (first, last): the positions of the item's
        real rows; a block every one of them sees whole, inside the cache, is folded without masks (rows past
        them compute what is never written)."""
        kv_len = kvlen_ref[seq_ref[w]]
        r = qpos.shape[0]
        d = kbuf.shape[-1]

        c = st.kv_compute
        chunks = n // c

        def attend(masked: bool):
            for h in range(hkv):
                q = q_of_head(h)
                at = (h, *rows)

                def chunk(ci, carry, h=h, q=q, at=at):
                    """Columns off .. off + c - 1 of the block into the softmax; with masks, none when the chunk
                    lies wholly past what the item sees (its pages were not read)."""
                    off = 0 if chunks == 1 else pl.multiple_of(ci * c, c)
                    first = start_of(kj) + off

                    def fold_chunk():
                        k = kbuf[slot, pl.ds(off, c), h, :].astype(q.dtype)
                        v = vbuf[slot, pl.ds(off, c), h, :].astype(q.dtype)
                        mask = None
                        if masked:
                            cols = first + jax.lax.broadcasted_iota(jnp.int32, (r, c), 1)
                            mask = (qpos >= 0) & (cols < kv_len)
                            if st.causal:
                                mask &= cols <= qpos
                            if st.window is not None:
                                mask &= cols > qpos - st.window
                            value_rows = first + jax.lax.broadcasted_iota(jnp.int32, (c, d), 0)
                            v = jnp.where(value_rows <= hi_ref[w], v, jnp.zeros_like(v))  # unread or past the end
                        s = _dot(q, k, (1, 1)) * (st.sm_scale * st.k_scale)  # [r, c]
                        if st.soft_cap is not None:
                            s = st.soft_cap * jnp.tanh(s / st.soft_cap)
                        online_softmax_step(s, mask, v, m_scr.at[at], l_scr.at[at], acc_scr.at[at])

                    if masked and chunks > 1:
                        pl.when(first <= hi_ref[w])(fold_chunk)
                    else:
                        fold_chunk()
                    return carry

                if chunks == 1:
                    chunk(0, 0)
                else:
                    jax.lax.fori_loop(0, chunks, chunk, 0)

        if span is None:
            attend(True)
            return
        end = start_of(kj) + n - 1  # the block's last position
        whole = end < kv_len
        if st.causal:
            whole &= end <= span[0]
        if st.window is not None:
            whole &= start_of(kj) > span[1] - st.window
        pl.when(whole)(lambda: attend(False))
        pl.when(~whole)(lambda: attend(True))

    def finished(h, rows, sink_rows):
        """[r, D] f32: kv head h's finished output in the scratch rows `rows` (fold's index tuple); `sink_rows`
        the same rows of the sinks (whose pattern repeats every G rows)."""
        at = (h, *rows)
        sink = sinks_ref[h, sink_rows] if st.has_sinks else None
        result = finish_softmax(m_scr[at], l_scr[at], acc_scr[at], sink)
        return result * st.v_scale if st.v_scale != 1.0 else result

    if "step" in phases:
        @pl.when(active(kj))
        def _step():
            @pl.when(active(kj + 1))
            def _prefetch():
                block_copies(kj + 1, 1 - slot, wait=False)

            block_copies(kj, slot, wait=True)
            if new is not None and st.mixed_block_q:  # a one-token sequence's item: its row is the only new one
                new.patch_own(w, pos_ref[w], jnp.minimum(start_of(kj) + n - 1, hi_ref[w]), start_of(kj), kbuf.at[slot],
                              vbuf.at[slot], layer_ref[0])
            elif new is not None:
                new.patch(w, seq_ref[w], kvlen_ref[seq_ref[w]], hi_ref[w], start_of(kj), n, kbuf.at[slot],
                          vbuf.at[slot], layer_ref[0])
            if not st.mixed_block_q:
                qpos = qpos_ref[...]  # [R, 1]
                if st.direct:
                    fold(lambda h: q_ref[pl.ds(h * g, g), :], qpos[:g], (slice(None),))
                else:
                    fold(lambda h: q_ref[h], qpos, (slice(None),))
                return

            @pl.when(rows_ref[w] == 1)
            def _one_token():
                qpos = jnp.full((g, 1), pos_ref[w], jnp.int32)
                fold(lambda h: qbuf[0, pl.ds(h * g, g), :], qpos, (0, pl.ds(0, g)), (pos_ref[w], pos_ref[w]))

            @pl.when(rows_ref[w] > 1)
            def _block():
                sub, rows = st.sub_q, rows_ref[w]

                def sub_block(b, carry):
                    first = b * sub  # the sub-block's first token within the item
                    token = first + jax.lax.div(jax.lax.broadcasted_iota(jnp.int32, (sub * g, 1), 0), g)  # token-major
                    qpos = jnp.where(token < rows, pos_ref[w] + token, -1)
                    last = pos_ref[w] + jnp.minimum(first + sub, rows) - 1
                    fold(lambda h: qbuf[pl.ds(first, sub), pl.ds(h * g, g), :].reshape(sub * g, qbuf.shape[-1]), qpos,
                         (b, slice(None)), (pos_ref[w] + first, last))
                    return carry

                jax.lax.fori_loop(0, jax.lax.div(rows + sub - 1, sub), sub_block, 0)

    if "finish" in phases:
        @pl.when(kj == pl.num_programs(1) - 1)
        def _finish():
            if new is not None:
                new.own_stores(w, layer_ref[0], wait=True)
            if not st.mixed_block_q:
                for h in range(hkv):
                    if st.project:  # the row as the unprojected output holds it, for the last step's projection
                        out_dtype = refs["po"].dtype
                        result = finished(h, (slice(None),), slice(None)).astype(out_dtype).astype(jnp.float32)
                        refs["rows"][w, pl.ds(h * g, g), :] = result
                        continue
                    result = finished(h, (slice(None),), slice(None)).astype(o_ref.dtype)
                    if st.direct:
                        o_ref[pl.ds(h * g, g), :] = result
                    else:
                        o_ref[h] = result
                return

            @pl.when(rows_ref[w] == 1)
            def _one_token():
                for h in range(hkv):
                    obuf[0, pl.ds(h * g, g), :] = finished(h, (0, pl.ds(0, g)), pl.ds(0, g)).astype(obuf.dtype)

            @pl.when(rows_ref[w] > 1)
            def _block():
                sub, d = st.sub_q, obuf.shape[-1]

                def sub_block(b, carry):
                    for h in range(hkv):
                        out = finished(h, (b, slice(None)), pl.ds(0, sub * g)).astype(obuf.dtype).reshape(sub, g, d)
                        obuf[pl.ds(b * sub, sub), pl.ds(h * g, g), :] = out
                    return carry

                jax.lax.fori_loop(0, jax.lax.div(rows_ref[w] + sub - 1, sub), sub_block, 0)

            for wait in (False, True):  # the item's output rows, to where its queries lie
                _rows_copies(rows_ref[w], lambda off, size: pltpu.make_async_copy(
                    obuf.at[pl.ds(off, size)], o_ref.at[pl.ds(first_ref[w] + off, size)], row_sems.at[1]),
                    st.mixed_block_q, wait=wait)


@dataclasses.dataclass(frozen=True)
class _Store:
    """A direct item's part in storing the new rows (PagedStatic.write); a mixed item's is its own row only
    (ItemRows: patch_own and own_stores, with no other new row of its sequence to patch).

    The pages an item reads may not hold its sequence's new rows yet (its own is stored by itself, others by other
    items, maybe on the other core), so after each block's pages land the item overwrites, in VMEM, the slots of its
    sequence's new rows inside the block and inside what it sees: its own from its VMEM block, any other (a sequence
    of several new tokens) copied from the new rows in HBM. Item w stores row w from its VMEM block to
    [layer, page, slot] once the block holding that position has landed (its page is then never read again by the
    item: a later block never re-reads a page before the last, and the last page holds the item's last position),
    and waits for the store when it finishes, so the cache holds every new row once the call returns."""

    page_ref: Any
    slot_ref: Any
    qstart_ref: Any
    qlen_ref: Any
    knew_ref: Any  # [1, Hkv, D] VMEM: row w
    vnew_ref: Any
    keys_hbm: Any  # [T, Hkv, D]
    values_hbm: Any
    k_out: Any
    v_out: Any
    wsems: Any  # DMA (2,): the own row's stores
    psems: Any  # DMA (2,): other rows' patches
    started: Any  # SMEM (1,) int32: 1 once the own row's stores started (what the finish waits for)

    def own_stores(self, w, layer, *, wait: bool) -> None:
        """Start the stores of row w's K and V (when it has a page), or wait for them (when they started)."""

        @pl.when((self.started[0] == 1) if wait else (self.page_ref[w] >= 0))
        def _go():
            page, slot = self.page_ref[w], self.slot_ref[w]
            at = (layer, page, pl.ds(slot, 1)) if self.k_out.ndim == 5 else (page, pl.ds(slot, 1))
            for src, dst, i in ((self.knew_ref, self.k_out, 0), (self.vnew_ref, self.v_out, 1)):
                c = pltpu.make_async_copy(src, dst.at[at], self.wsems.at[i])
                c.wait() if wait else c.start()

    def patch_own(self, w, own, last, start, kblock, vblock, layer) -> None:
        """Item w's own new row (position `own`, stored at page_ref[w] when that is a page) into kblock / vblock when
        the block holds it (start .. last), then the row's stores started: the block holding it has landed, so no
        read of the item's waits on them."""

        @pl.when((own >= start) & (own <= last) & (self.page_ref[w] >= 0))
        def _own():
            kblock[pl.ds(own - start, 1)] = self.knew_ref[...]
            vblock[pl.ds(own - start, 1)] = self.vnew_ref[...]
            self.own_stores(w, layer, wait=False)
            self.started[0] = 1

    def patch(self, w, seq, kv_len, hi, start, n: int, kblock, vblock, layer) -> None:
        """Positions start .. start + n - 1 are in kblock / vblock [n, Hkv, D]: the sequence's new rows among them,
        up to `hi` (the last position item w sees), written over what the pages held."""
        q, first_row = self.qlen_ref[seq], self.qstart_ref[seq]
        first_pos = kv_len - q  # the sequence's first new position; new row r sits at first_pos + r - first_row
        own = first_pos + w - first_row
        lo_x, hi_x = jnp.maximum(start, first_pos), jnp.minimum(start + n - 1, hi)
        self.patch_own(w, own, hi_x, start, kblock, vblock, layer)

        def other(x, carry):
            row = first_row + x - first_pos

            @pl.when((x != own) & (self.page_ref[row] >= 0))
            def _copy():
                at = pl.ds(x - start, 1)
                for src, dst, i in ((self.keys_hbm, kblock, 0), (self.values_hbm, vblock, 1)):
                    c = pltpu.make_async_copy(src.at[pl.ds(row, 1)], dst.at[at], self.psems.at[i])
                    c.start()
                    c.wait()

            return carry

        jax.lax.fori_loop(lo_x, jnp.maximum(hi_x + 1, lo_x), other, 0)


def _rows_copies(rows, copy, block_q: int, *, wait: bool = False) -> None:
    """Start (or, with `wait`, wait for) the copies of an item's first `rows` packed rows (0 <= rows <= block_q):
    DMA sizes are static, so a whole block goes as one copy and a shorter tail as powers of two, largest first,
    back to back (its binary digits), and no row past the item's own is touched. copy(offset, size) -> the
    descriptor."""
    whole = rows == block_q
    left = jnp.where(whole, 0, rows)
    offset = jnp.int32(0)
    sizes = [1 << i for i in range(block_q.bit_length()) if (1 << i) < block_q][::-1]
    for size in [block_q, *sizes]:
        take = whole if size == block_q else left >= size

        @pl.when(take)
        def _one(offset=offset, size=size):
            c = copy(offset, size)
            if wait:
                c.wait()
            else:
                c.start()

        if size != block_q:
            left = left - jnp.where(take, size, 0)
        offset = offset + jnp.where(take, size, 0)


def paged_forward(q_work, qpos_rows, sinks_rows, k_cache, v_cache, seq, lo, hi, kv_len, table,
                  st: PagedStatic, layer: jax.Array | None = None, new: NewRows | None = None,
                  out_proj: jax.Array | None = None):
    """q_work [W, Hkv, R, D] (direct: the packed queries [T, Hq, D] themselves, item w = row w); qpos_rows [W, R]
    int32; sinks_rows [Hkv, R] f32; caches [P, page, Hkv, D] (or [L, P, page, Hkv, D] read at `layer`, an int32
    scalar in [0, L)); seq/lo/hi [W], kv_len [S], table [S, pages_per_seq] int32 -> [W, Hkv, R, D] (direct:
    [T, Hq, D], padding rows 0) in the queries' dtype. With `new` (direct and st.write only): (output, k_cache,
    v_cache), the new rows stored by the kernel itself, the cache outputs aliasing the cache inputs. With
    `out_proj` (direct and st.project only: [Hq x D, N], or [L, Hq x D, N] read at `layer`): the output is
    [T, N], the rows times the projection."""
    hkv, d = st.kv_heads, q_work.shape[-1]
    w_count, r = q_work.shape[0], qpos_rows.shape[1]
    items = st.items if st.direct else 1
    pad = -w_count % items
    if pad:  # whole grid steps of `items` items: the padding items see nothing and store nothing
        out = paged_forward(*_pad_items(pad, q_work, qpos_rows), sinks_rows, k_cache, v_cache,
                            *_pad_items(pad, seq, lo), jnp.pad(hi, (0, pad), constant_values=-1), kv_len, table, st,
                            layer, None if new is None else NewRows(
                                *_pad_items(pad, new.keys, new.values), jnp.pad(new.page, (0, pad), constant_values=-1),
                                *_pad_items(pad, new.slot), new.q_start, new.q_len), out_proj)
        return out[:w_count] if new is None else (out[0][:w_count], *out[1:])
    qpos_col = qpos_rows[:, :, None]  # one column: a lane-wide copy would be an op of its own on every call
    sinks_wide = jnp.broadcast_to(sinks_rows[:, :, None], (hkv, r, LANES))
    lead = None if items == 1 else items  # a direct call's per-item blocks: `items` rows of the packed arrays
    if st.direct:
        q_spec = pl.BlockSpec((lead, hkv * st.group, d), lambda wi, kj, *_: (wi, 0, 0))
    else:
        q_spec = pl.BlockSpec((None, hkv, r, d), lambda wi, kj, *_: (wi, 0, 0, 0))
    # the operands and scratch every direct or grouped call has: queries, query positions, sinks; the kv buffers,
    # their semaphores and the online softmax's m / l / acc rows (one set per item of a step)
    in_specs = [q_spec, pl.BlockSpec((lead, r, 1), lambda wi, kj, *_: (wi, 0, 0)),
                pl.BlockSpec((hkv, r, LANES), lambda wi, kj, *_: (0, 0, 0))]
    each = () if items == 1 else (items,)
    scratch = [*_kv_buffers(st, d, k_cache.dtype, each), pltpu.VMEM((*each, hkv, r, LANES), jnp.float32),
               pltpu.VMEM((*each, hkv, r, LANES), jnp.float32), pltpu.VMEM((*each, hkv, r, d), jnp.float32)]
    scalars = (seq, lo, hi, kv_len, table.reshape(-1), _layer_operand(layer))
    operands = (q_work, qpos_col, sinks_wide)
    out_shape = jax.ShapeDtypeStruct(q_work.shape, q_work.dtype)
    o_spec = q_spec
    last = []  # scratch after the variant's own
    if st.project:  # the projection's weight (one layer's, read in place from a stack), one whole output block
        n = out_proj.shape[-1]
        if out_proj.ndim == 3:
            in_specs.append(pl.BlockSpec((None, hkv * st.group * d, n), lambda wi, kj, *refs: (refs[5][0], 0, 0)))
        else:
            in_specs.append(pl.BlockSpec((hkv * st.group * d, n), lambda wi, kj, *_: (0, 0)))
        operands = (*operands, out_proj)
        out_shape = jax.ShapeDtypeStruct((w_count, n), q_work.dtype)
        o_spec = pl.BlockSpec((w_count, n), lambda wi, kj, *_: (0, 0))
        last = [pltpu.VMEM((w_count, hkv * st.group, d), jnp.float32)]
    any_ = pl.BlockSpec(memory_space=pl.ANY)
    grid = (w_count // items, st.steps)
    if new is None:
        return _call(st, "ragged_paged_attention", scalars, grid, in_specs + [any_, any_], o_spec,
                     scratch + last, out_shape)(*scalars, *operands, k_cache, v_cache)
    # the store: row w's own K / V as VMEM blocks, every new row in HBM (the patches), the caches aliased out
    row_spec = pl.BlockSpec((items, hkv, d), lambda wi, kj, *_: (wi, 0, 0))
    scalars = (*scalars, new.page, new.slot, new.q_start, new.q_len)
    caches_at = len(scalars) + len(operands) + 4
    scratch += [pltpu.SemaphoreType.DMA((*each, 2)), pltpu.SemaphoreType.DMA((*each, 2)),
                pltpu.SMEM((items,), jnp.int32)]
    return _call(st, "ragged_paged_attention_store", scalars, grid,
                 in_specs + [row_spec, row_spec, any_, any_, any_, any_], (o_spec, any_, any_), scratch + last,
                 (out_shape, jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype),
                  jax.ShapeDtypeStruct(v_cache.shape, v_cache.dtype)),
                 aliases={caches_at: 1, caches_at + 1: 2},
                 )(*scalars, *operands, new.keys, new.values, new.keys, new.values, k_cache, v_cache)


def _pad_items(pad: int, *arrays: jax.Array) -> list[jax.Array]:
    """Each array with `pad` more rows of zeros (items that read page 0's slots and see nothing)."""
    return [jnp.pad(a, ((0, pad), *((0, 0),) * (a.ndim - 1))) for a in arrays]


def _kv_buffers(st: PagedStatic, d: int, dtype, each: tuple[int, ...] = ()) -> list:
    """The double-buffered K and V blocks (every kv head of pages_per_block pages) and their DMA semaphores; `each`
    (items,): one set per work item of a grid step."""
    buf = pltpu.VMEM((*each, 2, st.block_kv, st.kv_heads, d), dtype)
    return [buf, buf, pltpu.SemaphoreType.DMA((*each, 2, 2))]


def _layer_operand(layer: jax.Array | None) -> jax.Array:
    """The scalar-prefetched layer of stacked caches ([1] int32; 0 when the caches are not stacked)."""
    return jnp.zeros((1,), jnp.int32) if layer is None else jnp.asarray(layer, jnp.int32).reshape(1)


def _call(st: PagedStatic, name: str, scalars: tuple, grid: tuple[int, int], in_specs: list, out_specs, scratch: list,
          out_shape, aliases: dict[int, int] | None = None):
    """The pallas_call of one paged kernel variant: `scalars` scalar-prefetched, items parallel (in order when the
    last step projects every item's rows), kv steps in order."""
    return pl.pallas_call(
        functools.partial(_kernel, st=st),
        out_shape=out_shape,
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=len(scalars), grid=grid, in_specs=in_specs,
                                               out_specs=out_specs, scratch_shapes=scratch),
        input_output_aliases=aliases or {},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary" if st.project else "parallel",
                                                                  "arbitrary"),
                                             vmem_limit_bytes=st.vmem_limit_bytes),
        interpret=st.interpret,
        name=name,
    )


def paged_mixed_forward(queries, first, rows, pos, sinks_rows, k_cache, v_cache, seq, lo, hi, kv_len, table,
                        st: PagedStatic, layer: jax.Array | None = None, new: ItemRows | None = None):
    """_mixed_call on at least block_q query rows: every row copy the kernel traces (a whole item's block_q rows
    included) must fit the queries' shape, so a batch of fewer tokens is padded with rows no item covers. With `new`
    (st.write): (output, k_cache, v_cache), the items' own rows stored by the kernel, the caches aliased."""
    tokens = queries.shape[0]
    if tokens >= st.mixed_block_q:
        return _mixed_call(queries, first, rows, pos, sinks_rows, k_cache, v_cache, seq, lo, hi, kv_len, table, st,
                           layer, new)
    padded = jnp.pad(queries, ((0, st.mixed_block_q - tokens), (0, 0), (0, 0)))
    out = _mixed_call(padded, first, rows, pos, sinks_rows, k_cache, v_cache, seq, lo, hi, kv_len, table, st, layer,
                      new)
    return out[:tokens] if new is None else (out[0][:tokens], *out[1:])


def _mixed_call(queries, first, rows, pos, sinks_rows, k_cache, v_cache, seq, lo, hi, kv_len, table,
                st: PagedStatic, layer: jax.Array | None = None, new: ItemRows | None = None):
    """One call for any mix of decode steps and prefill chunks. queries [T, Hq, D] stay where they lie (HBM); work
    item w covers packed rows first[w] .. first[w] + rows[w] - 1 (at most st.mixed_block_q, consecutive rows of one
    sequence, the first at position pos[w]) and seq/lo/hi [W] as in paged_forward; an item of one row computes on
    its G heads only, a longer one on block_q * G rows. sinks_rows [Hkv, block_q * G] f32; kv_len [S], table
    [S, pages_per_seq] int32. -> [T, Hq, D] in the queries' dtype: each item's rows written by the item itself,
    every row no item covers (padding) 0."""
    bq, hkv = st.mixed_block_q, st.kv_heads
    _, hq, d = queries.shape
    r = bq * st.group
    sinks_wide = jnp.broadcast_to(sinks_rows[:, :, None], (hkv, r, LANES))
    any_ = pl.BlockSpec(memory_space=pl.ANY)
    sub, nsub = st.sub_q, st.sub_blocks
    rows_buf = pltpu.VMEM((nsub * sub, hq, d), queries.dtype)  # whole sub-blocks, so each slices in bounds
    scalars = (seq, lo, hi, kv_len, table.reshape(-1), _layer_operand(layer), first, rows, pos)
    scratch = [*_kv_buffers(st, d, k_cache.dtype), pltpu.VMEM((hkv, nsub, sub * st.group, LANES), jnp.float32),
               pltpu.VMEM((hkv, nsub, sub * st.group, LANES), jnp.float32),
               pltpu.VMEM((hkv, nsub, sub * st.group, d), jnp.float32), rows_buf, rows_buf,
               pltpu.SemaphoreType.DMA((2,))]
    sinks_spec = pl.BlockSpec((hkv, r, LANES), lambda wi, kj, *_: (0, 0, 0))
    out_shape = jax.ShapeDtypeStruct(queries.shape, queries.dtype)
    zeros = jnp.zeros(queries.shape, queries.dtype)
    if new is None:
        # the output starts as zeros (what padding rows keep); the items overwrite their own rows
        return _call(st, "ragged_paged_attention_mixed", scalars, (seq.shape[0], st.steps),
                     [any_, sinks_spec, any_, any_, any_], any_, scratch, out_shape, aliases={len(scalars) + 4: 0},
                     )(*scalars, queries, sinks_wide, k_cache, v_cache, zeros)
    # item w's own row as a VMEM block (read by its packed row), its stores' semaphores and started flag
    scalars = (*scalars, new.page, new.slot, new.row)
    at = len(scalars) - 1
    row_spec = pl.BlockSpec((1, hkv, d), lambda wi, kj, *refs: (refs[at][wi], 0, 0))
    scratch += [pltpu.SemaphoreType.DMA((2,)), pltpu.SMEM((1,), jnp.int32)]
    caches_at = len(scalars) + 4  # queries, sinks, own K row, own V row, then the caches and the zeros
    return _call(st, "ragged_paged_attention_mixed_store", scalars, (seq.shape[0], st.steps),
                 [any_, sinks_spec, row_spec, row_spec, any_, any_, any_], (any_, any_, any_), scratch,
                 (out_shape, jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype),
                  jax.ShapeDtypeStruct(v_cache.shape, v_cache.dtype)),
                 aliases={caches_at + 2: 0, caches_at: 1, caches_at + 1: 2},
                 )(*scalars, queries, sinks_wide, new.keys, new.values, k_cache, v_cache, zeros)
