"""Tile sizes for the attention kernels, chosen by a heuristic from shapes and injected chip facts.

Chip facts (the scoped-VMEM budget) are arguments, never queried: `pltpu.get_tpu_info()` at trace time
breaks CPU interpret mode and ties tracing to one chip generation.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from ._vendor.chips import chip_for_device_kind
from ._vendor.tiling import cdiv, round_up

#: Scoped-VMEM budget the default tiles must fit: 16 MiB is the smallest default among v4..v7x (v5e).
DEFAULT_VMEM_BUDGET_BYTES = 16 * 1024 * 1024

#: Lane width of a TPU vreg: the last dim of a block must be a multiple of it or the whole array dim.
LANES = 128


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Tiling of one attention call. Frozen so it can be a static (hashable) jit argument.

    block_q, block_kv: query rows and key columns per grid step of the prefill kernels (forward and
      both backward kernels). Each is either a multiple of 128 (the sequence is padded up to it) or at
      least the sequence length (one block covering the sequence, rounded up to 8).
    decode_block_kv: cache positions per grid step of the decode kernel, for all kv heads at once (multiple
      of 128 or >= cache; the kernel takes the largest multiple of 128 up to it that divides the cache, so the
      cache is never padded, i.e. copied).
    decode_kv_transposed: read the cache as [.., D, S] (True) or [.., S, D] (False); None follows the layout
      XLA gives the cache on a TPU (`kv_transposed`), so the cache reaches the kernel without a copy.
    heads_per_block: query heads of one kv group per forward grid step (the kernel takes the largest divisor of
      the group up to it); they share the step's K/V block.
    chunk_q, chunk_kv: the forward's inner tiles (0: the whole block): each query chunk computes only the key
      chunks its causal band / window reaches. The kernel takes the largest multiple of 128 up to each that
      divides the block (or the block).
    bwd_block_q, bwd_block_kv: the backward kernels' blocks (0: the forward's), taken the same way.
    paged_block_q, paged_pages_per_block: ragged paged attention's tokens per work item and cache pages per kv step
      (0: paged_blocks picks them).
    paged_items: decode work items one grid step of the paged kernel takes (0: decode_items picks them).
    cpu_block_q: query rows per chunk in the "cpu" path; each chunk only reads the keys its causal or
      sliding-window band can reach (static skipping), and bounds the score buffer.
    vmem_limit_bytes: scoped-VMEM limit handed to Mosaic; None keeps the compiler default.
    """

    block_q: int = 128
    block_kv: int = 128
    decode_block_kv: int = 512
    cpu_block_q: int = 256
    vmem_limit_bytes: int | None = None
    decode_kv_transposed: bool | None = None
    heads_per_block: int = 1
    chunk_q: int = 0
    chunk_kv: int = 0
    bwd_block_q: int = 0
    bwd_block_kv: int = 0
    paged_block_q: int = 0
    paged_pages_per_block: int = 0
    paged_items: int = 0

    def __post_init__(self) -> None:
        for name in ("block_q", "block_kv", "decode_block_kv", "cpu_block_q", "heads_per_block"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"AttentionConfig.{name} must be positive, got {value}")
        for name in ("chunk_q", "chunk_kv", "bwd_block_q", "bwd_block_kv", "paged_block_q", "paged_pages_per_block",
                     "paged_items"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"AttentionConfig.{name} must be 0 (the block) or positive, got {value}")


def sub_block(tile: int, want: int) -> int:
    """A tile's sub-tile: the largest multiple of 128 up to `want` that divides it; the tile itself when `want`
    is 0 or covers it, or when no multiple of 128 divides it (a short whole-sequence tile)."""
    if want <= 0 or want >= tile:
        return tile
    for size in range(want - want % LANES, LANES - 1, -LANES):
        if tile % size == 0:
            return size
    return tile


def vmem_plan(device_kind: str | None) -> tuple[int, int | None, str]:
    """(tile budget, scoped-VMEM limit for Mosaic or None, reason) for a chip: 7/8 of its physical VMEM, at most
    96 MiB, when that is above the 16 MiB every generation allows by default (the tiles then use 5/8 of it, the
    rest is Mosaic's); unknown chips (a CPU host tracing without a TPU device) and v4 keep the 16 MiB default
    with no limit set."""
    chip = chip_for_device_kind(device_kind)
    physical = chip.vmem_bytes if chip is not None else None
    if physical is None or physical * 7 // 8 <= DEFAULT_VMEM_BUDGET_BYTES:
        why = "unknown chip" if physical is None else f"{device_kind}: {physical >> 20} MiB of VMEM"
        return DEFAULT_VMEM_BUDGET_BYTES, None, f"{why}: the 16 MiB default scoped VMEM"
    limit = min(physical * 7 // 8, 96 << 20)
    return limit, limit, f"{device_kind}: {physical >> 20} MiB of VMEM, scoped limit {limit >> 20} MiB"


def device_kind_of(*arrays: object) -> str | None:
    """The device kind a call on these arrays runs on: their devices (concrete arrays), else jax's default device
    (set when compiling for a mock TPU), else the default backend's first device when it is a TPU. Never asks
    Pallas (pltpu.get_tpu_info at trace time breaks CPU interpret)."""
    import jax

    for a in arrays:
        if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
            return next(iter(a.devices())).device_kind
    default = jax.config.jax_default_device
    if default is not None and not isinstance(default, str):
        return default.device_kind
    return jax.devices()[0].device_kind if jax.default_backend() == "tpu" else None


def block_for(length: int, block: int) -> tuple[int, int]:
    """(tile, padded length) for one sequence axis under the TPU block rule: either one tile spanning
    the sequence (padded to a multiple of 8), or a multiple-of-128 tile with the sequence padded to it."""
    whole = round_up(max(length, 1), 8)
    if whole <= block:
        return whole, whole
    tile = round_up(block, LANES)
    return tile, round_up(length, tile)


def tile_bytes(rows: int, cols: int, itemsize: int) -> int:
    """VMEM bytes of a [rows, cols] tile as Mosaic lays it out: lanes padded to 128, sublanes to 8."""
    return round_up(max(rows, 1), 8) * round_up(max(cols, 1), LANES) * itemsize


def vmem_bytes(block_q: int, block_kv: int, head_dim: int, itemsize: int, heads: int = 1, *, chunk_q: int = 0,
               chunk_kv: int = 0, whole_kv: bool = False) -> int:
    """VMEM of one forward step over `heads` query heads: double-buffered q/o blocks and lse rows per head,
    k/v blocks, the f32 m/l/acc state (one chunk's when the key block is the whole sequence, `whole_kv`, else every
    row of every head) and one chunk's f32 score/probability temporaries."""
    cq, ck = chunk_q or block_q, chunk_kv or block_kv
    blocks = 2 * (heads * (2 * tile_bytes(block_q, head_dim, itemsize) + tile_bytes(1, block_q, 4))
                  + 2 * tile_bytes(block_kv, head_dim, itemsize))
    state_rows = cq if whole_kv else heads * block_q
    scratch = 2 * tile_bytes(state_rows, LANES, 4) + tile_bytes(state_rows, head_dim, 4)
    temps = 3 * cq * ck * 4
    return blocks + scratch + temps


def _sizes(length: int, cap: int) -> list[int]:
    """Block sizes to try along one sequence axis: the whole (rounded up to 8) when it fits under `cap`,
    then multiples of 128 halving down to 128."""
    whole = round_up(max(length, 1), 8)
    out = [whole] if whole <= cap else []
    size = cap
    while size >= LANES:
        if size < whole:
            out.append(size)
        size //= 2
    return out or [whole]


#: The forward's inner tile (query rows x key columns): a diagonal block wastes a chunk's triangle, i.e. a
#: fraction chunk / sequence of the causal work (6% at 256 over 4096), while each chunk's dots stay MXU-sized.
FORWARD_CHUNK = 256


@dataclasses.dataclass(frozen=True)
class PrefillTiles:
    block_q: int
    block_kv: int
    heads: int
    chunk: int
    bwd_block_q: int
    bwd_block_kv: int
    reason: str


def prefill_tiles(q_len: int, kv_len: int, head_dim: int, itemsize: int, group: int,
                  vmem_budget_bytes: int) -> PrefillTiles:
    """Forward: the most work per grid step (heads x block_q x block_kv) that fits 5/8 of the VMEM budget, with
    block_q <= 2048 and block_kv <= 8192, ties to more heads (they share the K/V block, fetched once per head
    group) then wider key blocks; inner chunks of FORWARD_CHUNK. A step costs
    ~0.35 us, which at head dim 64 is more than one head's 512 x 512 block of work, so big blocks pay; the chunks
    keep the causal waste of a big diagonal block to a chunk's triangle. Backward: the work per step of one head
    (block_q <= 512, block_kv <= 1024, dividing the forward's), whose [bk, bq] temporaries are several."""
    budget = vmem_budget_bytes * 5 // 8
    best: tuple[int, int, int, int] | None = None
    for heads in (h for h in range(group, 0, -1) if group % h == 0):
        for bq in _sizes(q_len, 2048):
            for bk in _sizes(kv_len, 8192):
                whole = bk >= kv_len
                need = vmem_bytes(bq, bk, head_dim, itemsize, heads, chunk_q=sub_block(bq, FORWARD_CHUNK),
                                  chunk_kv=sub_block(bk, FORWARD_CHUNK), whole_kv=whole)
                if need > budget:
                    continue
                key = (heads * bq * bk, heads, bk, bq)
                best = key if best is None or key > best else best
    if best is None:
        bq, bk, heads = min(LANES, round_up(max(q_len, 1), 8)), min(LANES, round_up(max(kv_len, 1), 8)), 1
        why = f"nothing fits 5/8 of {vmem_budget_bytes >> 20} MiB: the smallest blocks"
    else:
        _, heads, bk, bq = best
        why = (f"{heads} heads x {bq} x {bk} per step: the most work per step within 5/8 of "
               f"{vmem_budget_bytes >> 20} MiB of VMEM")
    bwd_q, bwd_k = LANES, LANES
    for q_ in _sizes(bq, 512):
        for k_ in _sizes(bk, 1024):
            fits = vmem_bytes(q_, k_, head_dim, itemsize) <= budget
            if fits and q_ * k_ > bwd_q * bwd_k and bq % q_ == 0 and bk % k_ == 0:
                bwd_q, bwd_k = q_, k_
    return PrefillTiles(bq, bk, heads, FORWARD_CHUNK, sub_block(bq, bwd_q), sub_block(bk, bwd_k), why)


def kv_transposed(length: int, head_dim: int) -> bool:
    """Whether XLA's TPU layout for a [.., length, head_dim] array puts `length` in the lanes: it picks whichever
    of the two orders pads less (v4, v5e, v5p, v6e and v7x alike, libtpu 0.0.52; e.g. head dim 64 over 128+
    positions). Reading the cache in that order spares XLA a copy of the whole cache before the kernel."""
    return tile_bytes(head_dim, length, 1) < tile_bytes(length, head_dim, 1)


def decode_vmem_bytes(block_kv: int, kv_heads: int, group: int, head_dim: int, itemsize: int,
                      transposed: bool) -> int:
    """VMEM of one decode step: double-buffered K/V blocks for every kv head, q/o blocks, the m/l/acc scratch
    and one head's f32 score temporaries."""
    kv = tile_bytes(head_dim, block_kv, itemsize) if transposed else tile_bytes(block_kv, head_dim, itemsize)
    blocks = 2 * (2 * kv_heads * kv + 2 * kv_heads * tile_bytes(group, head_dim, itemsize))
    scratch = kv_heads * (2 * tile_bytes(group, LANES, 4) + tile_bytes(group, head_dim, 4))
    return blocks + scratch + 3 * tile_bytes(group, block_kv, 4)


def decode_block(kv_len: int, head_dim: int, itemsize: int, *, kv_heads: int, group: int, window: int | None,
                 transposed: bool, vmem_budget_bytes: int) -> int:
    """Cache positions per decode step: the most (a multiple of 128, up to 8192) that fit 5/8 of the VMEM budget,
    fewer with a sliding window (no wider than the window, rounded up to 128): steps cost 0.35 us each, so a
    step should move megabytes, but a block past what a window needs is read for nothing."""
    cap = min(8192, round_up(max(kv_len, 1), LANES))
    if window is not None:
        cap = min(cap, round_up(window, LANES))
    block = cap
    while block > LANES and decode_vmem_bytes(block, kv_heads, group, head_dim, itemsize,
                                              transposed) > vmem_budget_bytes * 5 // 8:
        block -= LANES
    return block


@functools.cache  # called before the jit on every call: the tile search runs once per problem
def default_config(
    q_len: int,
    kv_len: int,
    head_dim: int,
    dtype: object = "bfloat16",
    *,
    kv_heads: int = 1,
    group: int = 1,
    window: int | None = None,
    vmem_budget_bytes: int = DEFAULT_VMEM_BUDGET_BYTES,
    vmem_limit_bytes: int | None = None,
) -> AttentionConfig:
    """Prefill tiles from prefill_tiles (query heads of a `group` per step, within the VMEM budget) and decode
    blocks sized for `kv_heads` heads of `group` queries each (decode_block). 5/8 of the budget (16 MiB: the
    smallest scoped VMEM among v4..v7x) leaves room for Mosaic's own temporaries; the compile gate checks
    every model geometry compiles on each generation."""
    itemsize = jnp.dtype(dtype).itemsize
    tiles = prefill_tiles(q_len, kv_len, head_dim, itemsize, group, vmem_budget_bytes)
    decode_bk = decode_block(kv_len, head_dim, itemsize, kv_heads=kv_heads, group=group, window=window,
                             transposed=kv_transposed(kv_len, head_dim), vmem_budget_bytes=vmem_budget_bytes)
    # CPU: 128-row chunks ran fastest at S=1024 on 2 cores (cache-resident scores, more band skipping);
    # longer sequences get wider chunks to keep the unrolled chunk count (compile time) near 16.
    cpu_bq = min(1024, max(128, round_up(cdiv(q_len, 16), 128)))
    return AttentionConfig(block_q=tiles.block_q, block_kv=tiles.block_kv, decode_block_kv=decode_bk,
                           cpu_block_q=cpu_bq, heads_per_block=tiles.heads, chunk_q=tiles.chunk, chunk_kv=tiles.chunk,
                           bwd_block_q=tiles.bwd_block_q, bwd_block_kv=tiles.bwd_block_kv,
                           vmem_limit_bytes=vmem_limit_bytes)


@dataclasses.dataclass(frozen=True)
class PagedBlocks:
    block_q: int  # tokens of one sequence per work item
    pages_per_block: int  # cache pages per kv step
    reason: str


def paged_vmem_bytes(rows: int, block_kv: int, kv_heads: int, head_dim: int, itemsize: int,
                     sub_rows: int | None = None) -> int:
    """VMEM of one ragged paged attention step: double-buffered K and V page buffers ([block_kv, Hkv, D], the heads
    counted padded to the dtype's packing: Gemma 4's global layers, 2 kv heads x 512 in bf16, compiled for v7x with
    16 pages of 128 per step, which a whole sublane tile of padding would not fit), double-buffered q/o blocks, the
    m/l/acc scratch of `rows` rows and three f32 [sub_rows, block_kv] temporaries (the rows one matmul computes:
    all of them unless the rows run in sub-blocks)."""
    packing = max(1, 4 // itemsize)
    pages = 2 * 2 * block_kv * round_up(kv_heads, packing) * round_up(head_dim, LANES) * itemsize
    blocks = 2 * 2 * kv_heads * tile_bytes(rows, head_dim, itemsize) + 2 * tile_bytes(rows, LANES, 4)
    scratch = kv_heads * (2 * tile_bytes(rows, LANES, 4) + tile_bytes(rows, head_dim, 4))
    return pages + blocks + scratch + 3 * tile_bytes(sub_rows or rows, block_kv, 4)


def paged_step_vmem_bytes(block_q: int, group: int, block_kv: int, kv_heads: int, head_dim: int,
                          itemsize: int) -> int:
    """paged_vmem_bytes of a call with `block_q` tokens a work item: a mixed item (block_q > 1) keeps block_q tokens'
    rows, padded to whole sub-blocks of MIXED_SUB_Q tokens, but computes one sub-block at a time, so its
    temporaries are a sub-block's rows (at most MIXED_SUB_Q x G), not block_q x G."""
    if block_q == 1:
        return paged_vmem_bytes(group, block_kv, kv_heads, head_dim, itemsize)
    sub = min(block_q, MIXED_SUB_Q)
    return paged_vmem_bytes(cdiv(block_q, sub) * sub * group, block_kv, kv_heads, head_dim, itemsize,
                            sub_rows=sub * group)


#: Most tokens a mixed work item computes at a time (pallas_paged: its rows run in sub-blocks of this many tokens,
#: as many as it has): at G query heads a kv head, 32 x G rows a matmul.
MIXED_SUB_Q = 32

#: Most cache positions a work item computes at a time inside its kv block (pallas_paged: the block's logits and
#: softmax run in chunks of this many columns, one loop body, however many pages a step copies): Mosaic emits a
#: tile's vector code whole, so a [rows, block_kv] step grew the kernel's compile time with its pages (a decode
#: step of 4 items x 16 pages x 4 kv heads: 65 s to compile for v6e whole, 12 s in chunks).
KV_COMPUTE = 512


def paged_blocks(tokens: int, seqs: int, group: int, page_size: int, pages_per_seq: int, kv_heads: int,
                 head_dim: int, itemsize: int, window: int | None, vmem_budget_bytes: int) -> PagedBlocks:
    """Tokens per work item: the mean new tokens per sequence rounded up to a power of two, at most 256 rows of
    block_q x G (decode: one token, its G heads as rows). Pages per step: the most that keep a step at or under 2048
    positions, inside the pages a sequence (or a window) can use, and within 5/8 of the VMEM budget: a step costs
    ~0.35 us, so it should move a megabyte or more of cache."""
    mean = cdiv(max(tokens, 1), max(seqs, 1))
    block_q = 1
    while block_q < mean and block_q * 2 * group <= 256:
        block_q *= 2
    cap = pages_per_seq
    if window is not None:
        cap = min(cap, cdiv(window + block_q - 1, page_size) + 1)
    ppb = max(1, min(cap, 2048 // page_size))
    while ppb > 1 and paged_step_vmem_bytes(block_q, group, ppb * page_size, kv_heads, head_dim,
                                            itemsize) > vmem_budget_bytes * 5 // 8:
        ppb -= 1
    why = (f"{block_q} token(s) x {group} heads per work item, {ppb} pages of {page_size} per step "
           f"(within 5/8 of {vmem_budget_bytes >> 20} MiB of VMEM)")
    return PagedBlocks(block_q, ppb, why)


#: Most decode work items one grid step of the paged kernel takes: each brings its own page buffers, and the step's
#: body is unrolled per item, so items x kv heads also stays within DECODE_UNROLL.
DECODE_ITEMS = 8
DECODE_UNROLL = 16


def decode_items(tokens: int, group: int, block_kv: int, kv_heads: int, head_dim: int, itemsize: int,
                 vmem_budget_bytes: int) -> tuple[int, str]:
    """Decode work items per grid step, and why: a step costs ~0.35 us whatever it moves, and a decode item of a
    short sequence moves little (64 sequences of 768 positions, one kv head: 64 steps of ~0.4 MB), so several items
    share a step, every item's pages requested before any computes. The most, a power of two, that keeps
    items x kv heads within DECODE_UNROLL, the items' buffers within 5/8 of the VMEM budget, and no more than the
    tokens need."""
    per_item = paged_step_vmem_bytes(1, group, block_kv, kv_heads, head_dim, itemsize)
    items = 1
    while (items * 2 <= DECODE_ITEMS and items < tokens and items * 2 * kv_heads <= DECODE_UNROLL
           and items * 2 * per_item <= vmem_budget_bytes * 5 // 8):
        items *= 2
    return items, (f"{items} decode item(s) per step ({per_item >> 10} KiB of VMEM each, {kv_heads} kv head(s), "
                   f"{tokens} token(s))")


#: Generations whose JAX device is a megacore (two TensorCores splitting a kernel's "parallel" grid axis).
MEGACORE_CHIPS = frozenset({"v4", "v5p"})


def fold_out_proj(tokens: int, q_heads: int, head_dim: int, n: int, itemsize: int, vmem_budget_bytes: int,
                  chip: str | None = None) -> tuple[bool, str]:
    """Whether a decode call's output projection runs inside the kernel, and why: the finished rows wait in VMEM (f32,
    query heads padded to whole sublane tiles) until the last grid step multiplies them by the projection, whose
    weight (double-buffered) and output block stay resident; all of it within a quarter of the VMEM budget (the
    items' page buffers keep their 5/8). Folded, the projection is no op of its own on the device, but the items run
    in order: on a megacore (`chip` in MEGACORE_CHIPS) that would leave one of its two cores idle, so not there."""
    if chip in MEGACORE_CHIPS:
        return False, f"projection after the kernel: {chip} is a megacore, whose two cores split the items"
    rows = tokens * -(-q_heads // 8) * 8 * head_dim * 4
    weight = 2 * q_heads * head_dim * n * itemsize
    out = 2 * tokens * -(-n // LANES) * LANES * itemsize
    need, cap = rows + weight + out, vmem_budget_bytes // 4
    if need > cap:
        return False, f"projection after the kernel: rows, weight and output need {need >> 10} KiB > {cap >> 10} KiB"
    return True, f"projection in the kernel ({need >> 10} KiB of VMEM)"
