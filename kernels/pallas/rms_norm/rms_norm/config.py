"""Row tiling of the RMSNorm kernels: how many rows one grid step normalises, from the shape and a VMEM budget.

A block always spans the whole hidden axis (the reduction), so it is legal for any hidden size (a block dim equal to
the array dim), 128-aligned or not. Rows come in multiples of 16 (a bf16 vreg holds 16 sublanes; also a multiple of
f32's 8), or all rows when there are fewer. The budget counts the float32 working tile: the kernels hold a few f32
copies of the block plus double-buffered input and output, so a 1 MiB f32 tile stays well inside v5e's 16 MiB scoped
VMEM (the smallest default among v4..v7x). Chip facts are arguments, never queried at trace time.
"""

from __future__ import annotations

import dataclasses

#: Bytes of one float32 working tile (rows x hidden x 4).
DEFAULT_TILE_BYTES = 1024 * 1024
ROW_MULTIPLE = 16
MAX_ROWS = 1024


@dataclasses.dataclass(frozen=True)
class RMSNormConfig:
    """block_rows: rows per grid step (None: from tile_bytes); tile_bytes: the f32 working-tile budget.
    Frozen, so it is a static jit argument."""

    block_rows: int | None = None
    tile_bytes: int = DEFAULT_TILE_BYTES

    def __post_init__(self) -> None:
        if self.block_rows is not None and (self.block_rows < 1 or self.block_rows % 8):
            raise ValueError(f"block_rows must be a positive multiple of 8, got {self.block_rows}")
        if self.tile_bytes < 4 * 128 * ROW_MULTIPLE:
            raise ValueError(f"tile_bytes {self.tile_bytes} is too small for one {ROW_MULTIPLE}-row tile")


def block_rows(rows: int, hidden: int, config: RMSNormConfig) -> int:
    """Rows per grid step: the configured or budgeted count, never more than the rows (then all of them)."""
    if config.block_rows is not None:
        want = config.block_rows
    else:
        want = max(ROW_MULTIPLE, min(MAX_ROWS, config.tile_bytes // (4 * max(hidden, 1))) // ROW_MULTIPLE
                   * ROW_MULTIPLE)
    return rows if rows <= want else want
