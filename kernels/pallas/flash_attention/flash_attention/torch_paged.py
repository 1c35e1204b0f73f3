"""Ragged paged attention in torch: the torch-native path of `ragged_paged_attention` and of flash-attn's paged calls.

Layout (the flash_attn_with_kvcache / transformers paged layout, the JAX contract's): queries [T, Hq, D] of many
sequences packed back to back (sequence s owns rows cu_q_lens[s]:cu_q_lens[s+1]); k_cache / v_cache
[num_pages, page_size, Hkv, D]; page_indices [S, pages_per_seq] (sequence s's position p lives in page
page_indices[s, p // page_size], row p % page_size); kv_lens [S] each sequence's length including its new tokens.
Query i of sequence s sits at position kv_lens[s] - q_len_s + i (bottom-right causal). New K/V rows, when given, are
written into their pages first (in place, as flash-attn does), then attention reads the pages.

The pages are walked a few at a time (CHUNK_BYTES of keys per step) with an online softmax in float32, so no step
holds more than one chunk of pages: the cache is never copied into one contiguous tensor. The query rows go in groups
of similar length (plan_work, WORK_BYTES of padded queries and of logits each), so a long prefill chunk beside many
decode steps pads nothing to its length. Imports torch
only (the torch-cpu build runs where jax is absent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .paged_args import int_arg

#: Bytes of float32 keys gathered per step of the page walk, across the sequences (rounded down to whole pages, at
#: least one page per sequence): what bounds the walk's memory, whatever the cache holds.
CHUNK_BYTES = 32 << 20
#: Bytes of float32 padded queries attended at once (and of one step's logits): what bounds the walk's memory,
#: whatever mix of prefill chunks and decode steps the batch holds.
WORK_BYTES = 64 << 20


#: fp8 dtypes this torch build knows (a cache in one is refused: see check_paged_call).
_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
             if hasattr(torch, n))


class PagedCacheError(ValueError):
    """A page table, length or cache that does not describe a valid paged call; the message names what to fix."""


@dataclass(frozen=True)
class PagedCall:
    """A checked ragged paged call: per-sequence query counts and starts, kv lengths, pages each sequence reads."""

    q_lens: torch.Tensor  # [S] int64
    q_starts: torch.Tensor  # [S] int64
    kv_lens: torch.Tensor  # [S] int64
    pages_needed: int  # max over sequences of ceil(kv_len / page_size)


def check_paged_call(queries: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lens: torch.Tensor,
                     page_indices: torch.Tensor, cu_q_lens: torch.Tensor, num_seqs: int | None = None,
                     *, who: str = "ragged_paged_attention") -> PagedCall:
    """Check every shape, length and page index a call will touch; PagedCacheError naming the first bad one.

    Only the pages a sequence needs (ceil(kv_len / page_size) of them) are checked and read: transformers fills the
    rest of a page-table row with -1."""
    def bad(what: str) -> PagedCacheError:
        return PagedCacheError(f"{who}: {what}")

    if queries.dim() != 3:
        raise bad(f"queries of shape {tuple(queries.shape)}: expected packed [tokens, q_heads, head_dim]")
    if k_cache.dim() != 4 or tuple(k_cache.shape) != tuple(v_cache.shape):
        raise bad(f"k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}: expected two caches of one shape "
                  "[num_pages, page_size, kv_heads, head_dim]")
    if k_cache.dtype != v_cache.dtype:
        raise bad(f"k_cache is {k_cache.dtype} and v_cache {v_cache.dtype}: both caches must share one dtype")
    if k_cache.dtype in _FP8:
        raise bad(f"{k_cache.dtype} caches are not taken by the torch entry (it has no k_scale / v_scale to dequantize "
                  "them with): keep the caches in the model's float dtype here, or call the JAX "
                  "ragged_paged_attention with float8_e4m3fn caches and k_scale / v_scale")
    num_pages, page_size, hkv, d = k_cache.shape
    if queries.shape[2] != d or queries.shape[1] % hkv:
        raise bad(f"queries {tuple(queries.shape)} against caches with {hkv} kv heads of size {d}: the head sizes must "
                  "match and the query heads be a multiple of the kv heads")
    for name, t, dims in (("kv_lens", kv_lens, 1), ("page_indices", page_indices, 2), ("cu_q_lens", cu_q_lens, 1)):
        if t.dim() != dims or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise bad(f"{name} of shape {tuple(t.shape)} and dtype {t.dtype}: expected a {dims}-D integer tensor")
    slots = kv_lens.shape[0]
    if page_indices.shape[0] != slots or cu_q_lens.shape[0] != slots + 1:
        raise bad(f"kv_lens [{slots}], page_indices {tuple(page_indices.shape)}, cu_q_lens [{cu_q_lens.shape[0]}]: "
                  "expected [S], [S, pages_per_seq] and [S + 1]")
    try:
        s = slots if num_seqs is None else int_arg(who, "num_seqs", num_seqs, low=0, high=slots)
    except ValueError as e:
        raise PagedCacheError(f"{e} (the sequence slots given: {slots})") from None
    cu = cu_q_lens[: s + 1].long()
    q_lens = cu[1:] - cu[:-1]
    lens = kv_lens[:s].long()
    if s and (int(cu[0]) != 0 or bool((q_lens < 0).any()) or int(cu[-1]) > queries.shape[0]):
        raise bad(f"cu_q_lens={cu.tolist()}: offsets must start at 0, never decrease and end within the "
                  f"{queries.shape[0]} query rows")
    if bool((lens < q_lens).any()):
        raise bad(f"kv_lens={lens.tolist()} below the new tokens per sequence {q_lens.tolist()} (kv_lens count them)")
    capacity = page_indices.shape[1] * page_size
    if s and int(lens.max()) > capacity:
        raise bad(f"kv_lens={lens.tolist()}: a sequence longer than its {page_indices.shape[1]} pages of {page_size} "
                  f"rows ({capacity}); give more pages per sequence")
    needed = (lens + page_size - 1) // page_size
    pages_needed = int(needed.max()) if s else 0
    used = torch.arange(page_indices.shape[1], device=page_indices.device)[None] < needed[:, None].to(
        page_indices.device)
    pages = page_indices[:s].long()
    out_of_range = used & ((pages < 0) | (pages >= num_pages))
    if bool(out_of_range.any()):
        seq, col = (int(x) for x in out_of_range.nonzero()[0])
        raise bad(f"page_indices[{seq}, {col}] = {int(pages[seq, col])} outside the cache's {num_pages} pages")
    return PagedCall(q_lens=q_lens, q_starts=cu[:-1], kv_lens=lens, pages_needed=pages_needed)


def new_row_slots(page_indices: torch.Tensor, call: PagedCall, page_size: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed row, page, row within the page) of every new token: sequence s's new rows sit at positions
    kv_len - q_len .. kv_len - 1."""
    q_lens = call.q_lens.to(device)
    if bool((q_lens == 1).all()):  # a decode step: one new row per sequence
        seq = torch.arange(q_lens.shape[0], device=device)
        within = torch.zeros_like(seq)
    else:
        seq = torch.repeat_interleave(torch.arange(q_lens.shape[0], device=device), q_lens)
        within = torch.arange(seq.shape[0], device=device) - torch.repeat_interleave(torch.cumsum(q_lens, 0) - q_lens,
                                                                                     q_lens)
    rows = call.q_starts.to(device)[seq] + within
    pos = (call.kv_lens.to(device) - q_lens)[seq] + within
    page = page_indices.long().to(device)[seq, pos // page_size]
    return rows, page, pos % page_size


def check_distinct_writes(page: torch.Tensor, offset: torch.Tensor, call: PagedCall, page_size: int,
                          who: str = "ragged_paged_attention") -> None:
    """PagedCacheError when two new rows (of two sequences, or one sequence listing a page twice) land on one page
    slot: which write wins would be unspecified. Pages shared for reading (a common prefix) are fine."""
    slot = page * page_size + offset
    ordered, order = torch.sort(slot, stable=True)
    same = (ordered[1:] == ordered[:-1]).nonzero()
    if same.numel():
        i = int(same[0, 0])
        a, b = int(order[i]), int(order[i + 1])
        seq = torch.repeat_interleave(torch.arange(call.q_lens.shape[0]), call.q_lens.cpu())
        raise PagedCacheError(f"{who}: sequences {int(seq[a])} and {int(seq[b])} both write page {int(page[a])} row "
                              f"{int(offset[a])}; a page this call writes must belong to one sequence (pages shared "
                              "for reading are fine)")


def write_new_rows(k_cache: torch.Tensor, v_cache: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   page_indices: torch.Tensor, call: PagedCall) -> None:
    """Write each sequence's new K/V rows (packed like the queries) into their pages, in place (whatever the caches'
    strides: transformers hands over views of one shared tensor)."""
    if not call.q_lens.shape[0] or int(call.q_lens.sum()) == 0:
        return
    rows, page, offset = new_row_slots(page_indices, call, k_cache.shape[1], keys.device)
    check_distinct_writes(page, offset, call, k_cache.shape[1])
    k_cache[page, offset] = keys[rows].to(k_cache.dtype)
    v_cache[page, offset] = values[rows].to(v_cache.dtype)


def read_new_rows(cache: torch.Tensor, page_indices: torch.Tensor, call: PagedCall, tokens: int) -> torch.Tensor:
    """The rows the new tokens occupy in `cache`, packed like the queries ([tokens, Hkv, D], zeros elsewhere): what a
    kernel that always writes its new rows gets when the cache already holds them."""
    out = cache.new_zeros((tokens, *cache.shape[2:]))
    if call.q_lens.shape[0] and int(call.q_lens.sum()):
        rows, page, offset = new_row_slots(page_indices, call, cache.shape[1], cache.device)
        out[rows] = cache[page, offset]
    return out


def _fused_cpu() -> bool:
    return hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def _attend_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, soft_cap: float | None,
                  has: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of pre-scaled q [S, H, R, D] over one chunk k/v [S, H, C, D] with keep [S, 1, R, C] ->
    (output normalised within the chunk, its log-sum-exp [S, H, R, 1]; -inf and 0 output where a row keeps nothing).
    On CPU torch's fused flash kernel (it returns the log-sum-exp the merge needs) where no soft cap applies. `has`
    [S, 1, R, 1]: whether each row keeps any key here, when the caller knows it (else read from keep)."""
    has = keep.any(-1, keepdim=True) if has is None else has
    if soft_cap is None and q.device.type == "cpu" and _fused_cpu():
        bias = torch.where(keep, 0.0, float("-inf"))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias,
                                                                             scale=1.0)
        return out, torch.where(has, lse[..., None], float("-inf"))  # a row with no key: output 0, lse reads 0
    logits = torch.matmul(q, k.transpose(-1, -2))  # [S, H, R, C]
    if soft_cap is not None:
        logits = soft_cap * torch.tanh(logits / soft_cap)
    logits = logits.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(logits, -1, keepdim=True)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    return torch.matmul(torch.exp(logits - safe), v), lse


@dataclass(frozen=True)
class WorkGroup:
    """Query rows attended together: items (sequence, first row, rows), padded to the widest item's rows."""

    items: tuple[tuple[int, int, int], ...]

    @property
    def width(self) -> int:
        return max(rows for _, _, rows in self.items)

    def padded_rows(self) -> int:
        return len(self.items) * self.width


def plan_work(q_lens: Sequence[int], row_bytes: int, budget: int) -> list[WorkGroup]:
    """Pure decision: the query rows of every sequence cut into items of at most budget // row_bytes rows, sorted by
    size and packed into groups whose padded rows (items x widest item) x row_bytes stay within `budget` (one item
    alone may reach it) and no item is under half its group's width (padding at most doubles the rows). So one long
    prefill chunk beside many decode steps never pads a decode step to the chunk's length. row_bytes: one query
    row's float32 bytes over all query heads."""
    max_rows = max(1, budget // max(1, row_bytes))
    items = [(s, r, min(max_rows, n - r)) for s, n in enumerate(int(x) for x in q_lens) for r in range(0, n, max_rows)]
    items.sort(key=lambda it: -it[2])
    groups: list[WorkGroup] = []
    current: list[tuple[int, int, int]] = []
    for item in items:
        if current and ((len(current) + 1) * current[0][2] * row_bytes > budget or 2 * item[2] < current[0][2]):
            groups.append(WorkGroup(tuple(current)))
            current = []
        current.append(item)
    if current:
        groups.append(WorkGroup(tuple(current)))
    return groups


def paged_attention(queries: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_indices: torch.Tensor,
                    call: PagedCall, *, causal: bool, sm_scale: float, sliding_window: int | None,
                    soft_cap: float | None, sinks: torch.Tensor | None,
                    chunk_bytes: int | None = None, work_bytes: int | None = None) -> torch.Tensor:
    """Attention of packed queries [T, Hq, D] over each sequence's pages -> [T, Hq, D] in the queries' dtype; rows past
    the last sequence's queries are 0, as is a row with nothing to attend. The rows go in groups (plan_work:
    `work_bytes`, default WORK_BYTES, of padded float32 queries each, and as much for one step's logits); each step
    gathers whole pages, at most `chunk_bytes` (default CHUNK_BYTES) of float32 keys across the group (at least one
    page)."""
    t, hq, d = queries.shape
    out = queries.new_zeros(queries.shape)
    if not call.q_lens.shape[0] or t == 0 or int(call.q_lens.sum()) == 0:
        return out
    budget = WORK_BYTES if work_bytes is None else work_bytes
    for group in plan_work(call.q_lens.tolist(), hq * d * 4, budget):
        _attend_group(out, queries, k_cache, v_cache, page_indices, call, group, causal=causal, sm_scale=sm_scale,
                      sliding_window=sliding_window, soft_cap=soft_cap, sinks=sinks,
                      chunk_bytes=CHUNK_BYTES if chunk_bytes is None else chunk_bytes, work_bytes=budget)
    return out


def _attend_group(out: torch.Tensor, queries: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  page_indices: torch.Tensor, call: PagedCall, group: WorkGroup, *, causal: bool, sm_scale: float,
                  sliding_window: int | None, soft_cap: float | None, sinks: torch.Tensor | None, chunk_bytes: int,
                  work_bytes: int) -> None:
    """One work group's rows of `out`, walking only the pages its rows can see (up to the last row's position when
    causal, from the first row's window start when windowed)."""
    hq, d = queries.shape[1:]
    page_size, hkv = k_cache.shape[1], k_cache.shape[2]
    g = hq // hkv
    dev = queries.device
    seq_ids, row0, rows_n = (torch.tensor(x, dtype=torch.int64) for x in zip(*group.items, strict=True))
    s, width = len(group.items), group.width
    kv_lens = call.kv_lens[seq_ids]
    first_pos = kv_lens - call.q_lens[seq_ids] + row0  # position of each item's first row
    last_seen = torch.minimum(first_pos + rows_n, kv_lens) if causal else kv_lens  # keys past it: never seen
    first_page = 0 if sliding_window is None else int((first_pos - sliding_window + 1).clamp(min=0).min()) // page_size
    end_page = int(((last_seen + page_size - 1) // page_size).max())
    q_lens, q_starts = rows_n.to(dev), (call.q_starts[seq_ids] + row0).to(dev)
    kv_lens, first_pos = kv_lens.to(dev), first_pos.to(dev)
    i = torch.arange(width, device=dev)
    q_valid = i[None] < q_lens[:, None]  # [S, W]
    rows = torch.where(q_valid, q_starts[:, None] + i[None], 0)
    # [S, Hkv, W*G, D]: each kv head's query rows (position-major, then the heads sharing it)
    q = queries[rows.reshape(-1)].reshape(s, width, hkv, g, d).float().permute(0, 2, 1, 3, 4) * sm_scale
    q = q.reshape(s, hkv, width * g, d)
    q_pos = first_pos[:, None] + i[None]  # [S, W]
    lse = torch.full((s, hkv, width * g, 1), float("-inf"), device=dev)  # running log-sum-exp of each row
    acc = torch.zeros((s, hkv, width * g, d), device=dev)  # running output, normalised by exp(lse)
    step = max(1, min(chunk_bytes // (s * page_size * hkv * d * 4), work_bytes // (s * width * hq * page_size * 4)))
    table = page_indices.long().to(dev)[seq_ids.to(dev)]
    for first in range(first_page, end_page, step):
        cols = torch.arange(first, min(first + step, end_page), device=dev)
        k_pos = (cols[:, None] * page_size + torch.arange(page_size, device=dev)[None]).reshape(-1)  # [C]
        pages = torch.where(cols[None] * page_size < kv_lens[:, None], table[:, cols], 0)  # unneeded pages: read page 0
        k = k_cache[pages].reshape(s, -1, hkv, d).transpose(1, 2).float()  # [S, Hkv, C, D]: this chunk of keys only
        v = v_cache[pages].reshape(s, -1, hkv, d).transpose(1, 2).float()
        keep = (k_pos[None, None] < kv_lens[:, None, None]) & q_valid[:, :, None]  # [S, W, C]
        if causal:
            keep = keep & (k_pos[None, None] <= q_pos[:, :, None])
        if sliding_window is not None:
            keep = keep & (k_pos[None, None] > q_pos[:, :, None] - sliding_window)
        keep = keep[:, None, :, None, :].expand(s, 1, width, g, keep.shape[-1]).reshape(s, 1, width * g, -1)
        # which rows keep any key of this chunk, from positions alone: [lo, hi] is the row's visible range here
        hi = torch.clamp(kv_lens[:, None] - 1, max=int(k_pos[-1]))
        hi = torch.minimum(hi, q_pos) if causal else hi
        lo = int(k_pos[0]) if sliding_window is None else torch.clamp(q_pos - sliding_window + 1, min=int(k_pos[0]))
        has = (q_valid & (hi >= lo))[:, None, :, None].expand(s, 1, width, g).reshape(s, 1, width * g, 1)
        out_c, lse_c = _attend_chunk(q, k, v, keep, soft_cap, has)
        new = torch.logaddexp(lse, lse_c)
        safe = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
        acc = acc * torch.exp(lse - safe) + out_c * torch.exp(lse_c - safe)  # exp(-inf) = 0 for an empty side
        lse = new
    if sinks is not None:  # one extra logit per query head in the denominator, no value
        sink = sinks.float().to(dev).reshape(1, hkv, 1, g).expand(1, hkv, width, g).reshape(1, hkv, width * g, 1)
        acc = acc * torch.exp(lse - torch.logaddexp(lse, sink))
    result = acc.reshape(s, hkv, width, g, d).permute(0, 2, 1, 3, 4).reshape(s * width, hq, d)
    out[rows[q_valid]] = result[q_valid.reshape(-1)].to(out.dtype)


def ragged_paged_attention_torch(queries: torch.Tensor, keys: torch.Tensor | None, values: torch.Tensor | None,
                                 k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lens: torch.Tensor,
                                 page_indices: torch.Tensor, cu_q_lens: torch.Tensor, num_seqs: int | None = None, *,
                                 causal: bool = True, sm_scale: float, sliding_window: int | None = None,
                                 soft_cap: float | None = None, sinks: torch.Tensor | None = None,
                                 who: str = "ragged_paged_attention") -> torch.Tensor:
    """Checks the call, writes the new rows (keys/values None: the caches already hold them), attends; -> out."""
    call = check_paged_call(queries, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, num_seqs, who=who)
    if (keys is None) != (values is None):
        raise PagedCacheError(f"{who}: pass both keys and values, or neither")
    if keys is not None:
        want = (queries.shape[0], k_cache.shape[2], k_cache.shape[3])
        if tuple(keys.shape) != want or tuple(values.shape) != want:
            raise PagedCacheError(f"{who}: keys {tuple(keys.shape)}, values {tuple(values.shape)}: expected {want} "
                                  "(packed like the queries)")
        write_new_rows(k_cache, v_cache, keys, values, page_indices, call)
    return paged_attention(queries, k_cache, v_cache, page_indices, call, causal=causal, sm_scale=sm_scale,
                           sliding_window=sliding_window, soft_cap=soft_cap, sinks=sinks)
