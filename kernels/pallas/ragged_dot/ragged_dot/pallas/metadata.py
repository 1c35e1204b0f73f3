"""Group metadata for the Pallas kernels, computed in JAX and handed to the kernel by scalar prefetch.

The grid walks a static list of W = tiles_m + G work items. An item is (m-tile, group):
  * one per (tile, group) pair whose rows intersect,
  * one per empty group (so the transposed kernel zeroes that group's gradient),
  * one per m-tile past sum(group_sizes) (so the forward kernel writes its zeros),
  * then padding items, repeats of the last real one, that do nothing.
Counting: nonempty pairs <= covered tiles + nonempty groups - 1, so the real items never exceed W.

Items are ordered so that both the tile and the group are non-decreasing: the forward kernel revisits
an output tile only on consecutive steps, the transposed kernel an output group only on consecutive
steps, which is what lets Pallas keep that block resident and write it back once.

Items without rows fetch the operands of the last item that had rows (items before the first one: that first
one's), so they cost no DMA: an empty expert's weights are never read.

The forward gets the items it runs packed (ForwardItems): each item's tile and weight block in one int32, the tile
and block it loads in another, and the groups' row offsets from which it computes each item's rows, so the scalar
memory it prefetches is two words per item plus one per group.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .._vendor.groups import group_bounds


class GroupMetadata(NamedTuple):
    """Per-item int32 arrays of length W, all scalar-prefetched into SMEM."""

    tile: jax.Array  # m-tile the item covers (forward: output block row)
    group: jax.Array  # group the item belongs to (transposed: output block)
    fetch_tile: jax.Array  # m-tile whose lhs/dout block to load
    fetch_group: jax.Array  # group whose rhs block to load
    row_lo: jax.Array  # first row of the item (absolute row index)
    row_hi: jax.Array  # one past its last row; row_lo == row_hi: no work

    @property
    def num_items(self) -> int:
        return self.tile.shape[0]


class ForwardItems(NamedTuple):
    """The forward's scalar-prefetch operands, int32 in SMEM. An item packs (row tile << shift) | weight block."""

    items: jax.Array  # [W]: the items the forward runs, first, in order (forward_items), then ones it never runs
    fetch: jax.Array  # [W]: the row tile and weight block whose operands each item loads, packed the same way
    offsets: jax.Array  # [G + 1]: the first row of each group, then one past the last group's rows


def group_offsets(group_sizes: jax.Array, m: int) -> jax.Array:
    """[G + 1] row offsets of the groups of an lhs whose first `m` rows are real (group_bounds' starts, then the last
    end): group g owns rows [offsets[g], offsets[g + 1])."""
    starts, ends = group_bounds(group_sizes, m)
    return jnp.concatenate([starts, ends[-1:]])


def block_shift(num_blocks: int, tiles_m: int) -> int:
    """Bits the packed items give the weight block (the tile takes the bits above), after one clear error when a
    tile index would not fit the rest of an int32."""
    shift = max(1, (num_blocks - 1).bit_length())
    if tiles_m << shift >= 2**31:
        raise ValueError(f"{tiles_m} row tiles x {num_blocks} weight blocks do not pack into int32 work items: "
                         "use a larger row tile (config tm)")
    return shift


def pack_forward(meta: GroupMetadata, offsets: jax.Array, tiles_m: int, shift: int) -> tuple[ForwardItems, jax.Array]:
    """The forward's packed items and how many it runs (its grid bound).

    The items past forward_items' bound are cut to tiles_m + blocks - 1 (the most it can run: the pairs with rows
    number at most covered tiles + blocks with rows - 1, plus one per tile past the rows)."""
    kept, bound = forward_items(meta, tiles_m)
    w = meta.num_items - 1  # num_work_items: tiles_m + blocks

    def pack(tile: jax.Array, block: jax.Array) -> jax.Array:
        return jnp.left_shift(tile[:w], shift) | block[:w]

    return ForwardItems(pack(kept.tile, kept.group), pack(kept.fetch_tile, kept.fetch_group), offsets), bound


def num_work_items(m_padded: int, tm: int, num_groups: int) -> int:
    """Static length of the item list (the grid size along items)."""
    return m_padded // tm + num_groups


def make_group_metadata(group_sizes: jax.Array, *, m_padded: int, tm: int, m: int | None = None) -> GroupMetadata:
    """Work items for an lhs of `m_padded` rows (a multiple of tm) whose first `m` rows are real."""
    if m_padded % tm:
        raise ValueError(f"m_padded={m_padded} must be a multiple of tm={tm}")
    m = m_padded if m is None else m
    g = group_sizes.shape[0]
    tiles_m = m_padded // tm
    w = num_work_items(m_padded, tm, g)

    starts, ends = group_bounds(group_sizes, m)
    nonempty = ends > starts
    first_tile = jnp.minimum(starts // tm, tiles_m - 1)
    last_tile = jnp.where(nonempty, (ends - 1) // tm, first_tile)
    per_group = last_tile - first_tile + 1  # empty groups get one (row-less) visit

    total = ends[-1]
    covered = (total + tm - 1) // tm
    # Segment g < G: the tiles of group g. Segment G: the tiles past the last row (owned by group G-1).
    counts = jnp.concatenate([per_group, (tiles_m - covered)[None]]).astype(jnp.int32)
    seg_first_tile = jnp.concatenate([first_tile, covered[None]])
    seg_begin = jnp.cumsum(counts) - counts
    n_real = jnp.sum(counts)

    i = jnp.arange(w, dtype=jnp.int32)
    seg = jnp.repeat(jnp.arange(g + 1, dtype=jnp.int32), counts, total_repeat_length=w)
    real = i < n_real
    tile = jnp.where(real, seg_first_tile[seg] + (i - seg_begin[seg]), tiles_m - 1)
    group = jnp.where(real, jnp.minimum(seg, g - 1), g - 1)

    row_lo = jnp.maximum(starts[group], tile * tm)
    row_hi = jnp.minimum(ends[group], tile * tm + tm)
    has_rows = real & (row_lo < row_hi)
    row_hi = jnp.where(has_rows, row_hi, row_lo)

    # the last item with rows at or before each item; items before the first one take that first one, so leading
    # empty groups (a device whose first local experts got no token) fetch nothing extra either
    source = jnp.maximum(jax.lax.cummax(jnp.where(has_rows, i, 0)), jnp.argmax(has_rows).astype(jnp.int32))
    return GroupMetadata(
        tile=tile.astype(jnp.int32),
        group=group.astype(jnp.int32),
        fetch_tile=tile[source].astype(jnp.int32),
        fetch_group=group[source].astype(jnp.int32),
        row_lo=row_lo.astype(jnp.int32),
        row_hi=row_hi.astype(jnp.int32),
    )


def forward_items(meta: GroupMetadata, tiles_m: int) -> tuple[GroupMetadata, jax.Array]:
    """The items the forward kernel must run, first and in order, and how many there are (its grid bound).

    Why: the forward needs only the items with rows, plus one item for each m-tile no such item covers (it
    writes that tile's zeros). The empty groups' visits (which the transposed kernel needs, to zero their
    gradient) and the padding items are dropped, so a decode over 128 experts runs one grid step per (tile,
    expert) pair with rows instead of tiles + 128. Order is kept, so an output tile is still revisited only on
    consecutive steps; the dropped items move past the bound, where the kernel never runs.
    """
    has_rows = meta.row_lo < meta.row_hi
    covered = jnp.zeros((tiles_m,), bool).at[meta.tile].max(has_rows)
    # tiles never decrease along the items (padding repeats the last tile): the first item of a run of equal
    # tiles is that tile's first visit; one such visit is kept for a tile no item with rows covers
    first_of_tile = jnp.concatenate([jnp.ones((1,), bool), meta.tile[1:] != meta.tile[:-1]])
    keep = has_rows | (first_of_tile & ~covered[meta.tile])
    order = jnp.argsort(~keep, stable=True).astype(jnp.int32)
    return GroupMetadata(*(a[order] for a in meta)), jnp.sum(keep).astype(jnp.int32)
