"""Tile sizes for the Pallas kernels and the row capacity of the CPU path.

Chip facts (VMEM budget) come in as arguments so nothing asks the TPU runtime at trace time:
`pltpu.get_tpu_info()` breaks CPU interpret mode and ties tracing to one chip.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._vendor.tiling import round_up

#: Scoped-VMEM budget the default tiles must fit in. 16 MiB is the smallest default among
#: v4/v5e/v5p/v6e/v7x (v5e); pass a larger one for chips that have it.
DEFAULT_VMEM_BUDGET_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class RaggedDotConfig:
    """Tiling of one grouped matmul. Frozen so it can be a static (hashable) jit argument.

    tm, tk, tn: row, contraction and output-column tiles of the Pallas kernels. K and N are zero-padded
      up to multiples of tk and tn, M up to a multiple of tm (padding rows belong to no group).
    vmem_limit_bytes: passed to Mosaic as the scoped-VMEM limit; None keeps the compiler default.
    cpu_capacity: rows per group in the CPU path's batched matmul (rows beyond it go through a loop);
      None picks from the average group size.
    """

    tm: int = 128
    tk: int = 512
    tn: int = 512
    vmem_limit_bytes: int | None = None
    cpu_capacity: int | None = None

    def __post_init__(self) -> None:
        for name in ("tm", "tk", "tn"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RaggedDotConfig.{name} must be positive, got {getattr(self, name)}")
        if self.cpu_capacity is not None and self.cpu_capacity <= 0:
            raise ValueError(f"cpu_capacity must be positive, got {self.cpu_capacity}")

    def swapped_kn(self) -> RaggedDotConfig:
        """The same tiling for the transposed problem (d_lhs contracts over N and produces K)."""
        return dataclasses.replace(self, tk=self.tn, tn=self.tk)


def _pick_lane_tile(dim: int, cap: int) -> int:
    """Largest multiple of 128 <= cap dividing round_up(dim, 128); the full dim when it is small."""
    if dim <= cap:
        return dim if dim % 128 == 0 or dim < 128 else round_up(dim, 128)
    padded = round_up(dim, 128)
    for t in range(cap - cap % 128, 127, -128):
        if padded % t == 0:
            return t
    return 128


def vmem_bytes(cfg: RaggedDotConfig, in_itemsize: int, out_itemsize: int) -> int:
    """Bytes of VMEM one grid step holds: double-buffered inputs/outputs plus the f32 accumulator."""
    ins = 2 * (cfg.tm * cfg.tk + cfg.tk * cfg.tn) * in_itemsize
    outs = 2 * cfg.tm * cfg.tn * out_itemsize
    return ins + outs + cfg.tm * cfg.tn * 4


def default_config(
    m: int,
    k: int,
    n: int,
    g: int,
    dtype: object = "bfloat16",
    *,
    vmem_budget_bytes: int = DEFAULT_VMEM_BUDGET_BYTES,
) -> RaggedDotConfig:
    """Heuristic tiles: tm 128 (or all rows when fewer, rounded to the sublane packing), tk/tn up to 512
    (multiples of 128 dividing the padded dim so weights need no per-call padding), shrunk until the
    step fits `vmem_budget_bytes`."""
    del g  # the grid already adapts to the number of groups; kept for a future tuned table
    itemsize = np.dtype(dtype).itemsize if str(dtype) != "bfloat16" else 2
    sublanes = 16 if itemsize == 2 else 8
    tm = 128 if m > 128 else max(sublanes, round_up(m, sublanes))
    tk = _pick_lane_tile(k, 512)
    tn = _pick_lane_tile(n, 512)
    cfg = RaggedDotConfig(tm=tm, tk=tk, tn=tn)
    while vmem_bytes(cfg, itemsize, 4) > vmem_budget_bytes and max(cfg.tk, cfg.tn) > 128:
        if cfg.tk >= cfg.tn:
            cfg = dataclasses.replace(cfg, tk=max(128, cfg.tk // 2))
        else:
            cfg = dataclasses.replace(cfg, tn=max(128, cfg.tn // 2))
    return cfg
