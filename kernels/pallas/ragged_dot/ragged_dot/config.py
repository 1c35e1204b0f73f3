"""Tile sizes for the Pallas kernels and the row capacity of the CPU path.

Chip facts (VMEM budget) come in as arguments so nothing asks the TPU runtime at trace time:
`pltpu.get_tpu_info()` breaks CPU interpret mode and ties tracing to one chip.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._vendor.tiling import cdiv, round_up

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


def lane_tiles(dim: int, padded: bool = False) -> list[int]:
    """Tiles for a lane (K or N) dim, largest first. Unpadded: the whole dim (a block may span a full array
    dim of any size), then the multiples of 128 dividing it. padded=True: the multiples of 128 dividing
    the dim rounded up to 128 (the weights then get padded on every call)."""
    if padded:
        full = round_up(dim, 128)
        return [t for t in range(full, 127, -128) if full % t == 0]
    return [dim] + [t for t in range(dim - dim % 128, 127, -128) if t < dim and dim % t == 0]


def vmem_bytes(cfg: RaggedDotConfig, in_itemsize: int, out_itemsize: int) -> int:
    """Bytes of VMEM one grid step holds: double-buffered inputs/outputs plus the f32 accumulator."""
    ins = 2 * (cfg.tm * cfg.tk + cfg.tk * cfg.tn) * in_itemsize
    outs = 2 * cfg.tm * cfg.tn * out_itemsize
    return ins + outs + cfg.tm * cfg.tn * 4


#: Share of the VMEM budget the estimate may fill: Mosaic keeps temporaries of its own (dot results, masks),
#: and splits f32 operands of a HIGHEST-precision dot into bf16 parts it also holds in VMEM. The TPU compile
#: gate (kernel-hub validate --tpu) checks that the resulting tiles compile on every generation.
VMEM_HEADROOM = {2: 0.95, 4: 0.5}


def usable_vmem(itemsize: int, vmem_budget_bytes: int = DEFAULT_VMEM_BUDGET_BYTES) -> int:
    """Bytes of VMEM the blocks of a kernel on `itemsize`-byte operands may take."""
    return int(vmem_budget_bytes * VMEM_HEADROOM.get(itemsize, 0.5))


def transposed_config(cfg: RaggedDotConfig, kp: int, np_: int, itemsize: int,
                      vmem_budget_bytes: int = DEFAULT_VMEM_BUDGET_BYTES) -> RaggedDotConfig:
    """Tiles of the backward's d_lhs kernel (dout[Mp, Np] @ rhs^T -> [Mp, Kp]): the forward's with K and N swapped
    when they fit the VMEM budget, else the fewest-steps tiles dividing the swapped ones (contraction over `np_`,
    output over `kp`) that do. Why: the swapped kernel's output block and f32 accumulator are tm x K instead of
    tm x N, so tiles that just fit the forward (GPT-OSS gate_up: tk 2880, tn 1152) need 16.5 MiB there, over
    v4's and v5p's 16; 2880 has no smaller lane tile, so the contraction tile shrinks instead."""
    swapped = cfg.swapped_kn()
    limit = usable_vmem(itemsize, vmem_budget_bytes)
    if vmem_bytes(swapped, itemsize, itemsize) <= limit:
        return swapped
    fits = [dataclasses.replace(swapped, tk=tk, tn=tn)
            for tk in lane_tiles(np_) if tk <= swapped.tk and swapped.tk % tk == 0
            for tn in lane_tiles(kp) if tn <= swapped.tn and swapped.tn % tn == 0]
    fits = [c for c in fits if vmem_bytes(c, itemsize, itemsize) <= limit]
    if not fits:
        return swapped
    return min(fits, key=lambda c: (cdiv(np_, c.tk) * cdiv(kp, c.tn), -c.tn))


def grid_steps(cfg: RaggedDotConfig, m: int, k: int, n: int, g: int) -> int:
    """Grid steps of the forward kernel: (m tiles + groups) work items x k tiles x n tiles."""
    return (cdiv(m, cfg.tm) + g) * cdiv(k, cfg.tk) * cdiv(n, cfg.tn)


def default_config(
    m: int,
    k: int,
    n: int,
    g: int,
    dtype: object = "bfloat16",
    *,
    vmem_budget_bytes: int = DEFAULT_VMEM_BUDGET_BYTES,
) -> RaggedDotConfig:
    """Heuristic tiles: the fewest grid steps whose blocks fit the VMEM budget, with K and N tiles that
    need no padded weights (whole dims, or multiples of 128 dividing them).

    Why: a grid step costs ~0.35 us however little it moves, and a decode step moves one rhs block (a
    512x512 bf16 block is 0.5 MiB: ~0.3 us at v6e's 1.6 TB/s), so small tiles double the time of a
    bandwidth-bound MoE layer. With tk = K the rhs block index stays put across an expert's m-tiles, so
    each active expert's weights are read once. tm stays 128 (or all rows): the backward's tgmm puts it on
    the lanes of a block, where it must be a multiple of 128 or the whole padded M. Ties go to larger tk."""
    itemsize = np.dtype(dtype).itemsize if str(dtype) != "bfloat16" else 2
    sublanes = 16 if itemsize == 2 else 8
    row_tiles = [128 if m > 128 else max(sublanes, round_up(m, sublanes))]
    budget = usable_vmem(itemsize, vmem_budget_bytes)
    for padded in (False, True):  # padded weights (a copy per call) only when nothing unpadded fits
        best, best_key = None, None
        for tm in row_tiles:
            for tk in lane_tiles(k, padded):
                for tn in lane_tiles(n, padded):
                    cfg = RaggedDotConfig(tm=tm, tk=tk, tn=tn)
                    if vmem_bytes(cfg, itemsize, itemsize) > budget:
                        continue
                    key = (grid_steps(cfg, m, k, n, g), -tk)
                    if best_key is None or key < best_key:
                        best, best_key = cfg, key
        if best is not None:
            return best
    return RaggedDotConfig(tm=row_tiles[-1], tk=128, tn=128)
