"""Tile sizes for the Pallas kernels and the row capacity of the CPU path.

Chip facts (VMEM budget) come in as arguments so nothing asks the TPU runtime at trace time:
`pltpu.get_tpu_info()` breaks CPU interpret mode and ties tracing to one chip.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .._vendor.chips import DEFAULT_SCOPED_VMEM_BYTES, VMEM_BUDGET_FRACTION, ChipFacts, tile_budget_bytes
from .._vendor.tiling import cdiv, round_up

#: Scoped-VMEM budget the backward's tiles must fit in: the 16 MiB every generation grants by default. (The forward
#: sizes its tiles by chips.tile_budget_bytes instead; the backward keeps the budget its tiles were compiled with.)
DEFAULT_VMEM_BUDGET_BYTES = DEFAULT_SCOPED_VMEM_BYTES


@dataclasses.dataclass(frozen=True)
class RaggedDotConfig:
    """Tiling of one grouped matmul. Frozen so it can be a static (hashable) jit argument.

    tm, tk, tn: row, contraction and output-column tiles of the Pallas kernels. K and N are zero-padded
      up to multiples of tk and tn, M up to a multiple of tm (padding rows belong to no group).
    vmem_limit_bytes: passed to Mosaic as the scoped-VMEM limit; None keeps the compiler default.
    cpu_capacity: rows per group in the CPU path's batched matmul (rows beyond it go through a loop);
      None picks from the average group size.
    experts_per_step: experts whose weight blocks one forward grid step loads together (it must divide the
      number of groups, else 1 is used): fewer, larger steps when each expert has few rows (decode).
    row_window: rows per MXU dot inside a row tile (a multiple of 16 up to tm); only windows holding an expert's
      rows are computed, the first starting at the expert's first row (rounded down to 16), so a large tm costs
      no MXU work on other experts' rows. None: min(tm, 128).
    """

    @property
    def window(self) -> int:
        if self.row_window is not None:
            return self.row_window
        return 128 if self.tm > 128 and self.tm % 16 == 0 else self.tm

    tm: int = 128
    tk: int = 512
    tn: int = 512
    vmem_limit_bytes: int | None = None
    cpu_capacity: int | None = None
    experts_per_step: int = 1
    row_window: int | None = None

    def __post_init__(self) -> None:
        for name in ("tm", "tk", "tn", "experts_per_step"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RaggedDotConfig.{name} must be positive, got {getattr(self, name)}")
        if self.row_window is not None and not (0 < self.row_window <= self.tm and self.row_window % 16 == 0
                                                and self.tm % 16 == 0):
            raise ValueError(f"row_window must be a multiple of 16 up to tm={self.tm} (itself a multiple of 16), "
                             f"got {self.row_window}")
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


def vmem_bytes(cfg: RaggedDotConfig, in_itemsize: int, out_itemsize: int, k_steps: int = 2) -> int:
    """Bytes of VMEM one forward grid step holds: double-buffered lhs / weight / output blocks, the f32
    accumulator when K takes several steps (k_steps > 1), and one row window's f32 dot result."""
    ins = 2 * (cfg.tm * cfg.tk + cfg.experts_per_step * cfg.tk * cfg.tn) * in_itemsize
    outs = 2 * cfg.tm * cfg.tn * out_itemsize
    acc = cfg.tm * cfg.tn * 4 if k_steps > 1 else 0
    return ins + outs + acc + 2 * cfg.window * cfg.tn * 4


def backward_vmem_bytes(cfg: RaggedDotConfig, in_itemsize: int, out_itemsize: int) -> int:
    """The backward's per-step VMEM estimate (tm x tk lhs, tk x tn weights, tm x tn output, double-buffered, and an
    f32 accumulator): the one its tiles were validated against by the compile gate, kept as it was."""
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
    if backward_vmem_bytes(swapped, itemsize, itemsize) <= limit:
        return swapped
    fits = [dataclasses.replace(swapped, tk=tk, tn=tn)
            for tk in lane_tiles(np_) if tk <= swapped.tk and swapped.tk % tk == 0
            for tn in lane_tiles(kp) if tn <= swapped.tn and swapped.tn % tn == 0]
    fits = [c for c in fits if backward_vmem_bytes(c, itemsize, itemsize) <= limit]
    if not fits:
        return swapped
    return min(fits, key=lambda c: (cdiv(np_, c.tk) * cdiv(kp, c.tn), -c.tn))


def grid_steps(cfg: RaggedDotConfig, m: int, k: int, n: int, g: int) -> int:
    """Grid steps of the backward's kernels: (m tiles + groups) work items x k tiles x n tiles."""
    return (cdiv(m, cfg.tm) + g) * cdiv(k, cfg.tk) * cdiv(n, cfg.tn)


def _itemsize(dtype: object) -> int:
    return np.dtype(dtype).itemsize if str(dtype) != "bfloat16" else 2


def backward_config(m: int, k: int, n: int, g: int, dtype: object = "bfloat16") -> RaggedDotConfig:
    """Tiles of the backward (d_lhs gmm and tgmm) when none were given: the fewest steps (m tiles + groups per
    (k, n) tile pair) whose blocks fit the 16 MiB every generation's scoped VMEM allows, one expert per step,
    tm 128 (or all rows). Why: tgmm puts tm on the lanes of a block (a multiple of 128 or the whole padded M),
    and the backward keeps the conservative budget it was validated with; ties go to larger tk."""
    itemsize = _itemsize(dtype)
    sublanes = 16 if itemsize == 2 else 8
    tm = 128 if m > 128 else max(sublanes, round_up(m, sublanes))
    budget = usable_vmem(itemsize)
    for padded in (False, True):  # padded weights (a copy per call) only when nothing unpadded fits
        fits = [RaggedDotConfig(tm=tm, tk=tk, tn=tn) for tk in lane_tiles(k, padded) for tn in lane_tiles(n, padded)]
        fits = [c for c in fits if backward_vmem_bytes(c, itemsize, itemsize) <= budget]
        if fits:
            return min(fits, key=lambda c: (grid_steps(c, m, k, n, g), -c.tk))
    return RaggedDotConfig(tm=tm, tk=128, tn=128)


#: When the chip is not known (CPU interpret, an unrecognised device): every generation's smallest scoped VMEM.
UNKNOWN_CHIP = ChipFacts("unknown", DEFAULT_SCOPED_VMEM_BYTES, DEFAULT_SCOPED_VMEM_BYTES, 819e9, 197e12)
#: Per grid step of a Pallas TPU pipeline (the Pallas TPU docs' ~0.35 us).
STEP_SECONDS = 0.35e-6
#: VMEM the compiler keeps for itself beyond a raised scoped limit.
_MIB = 1024 * 1024
_COMPILER_RESERVE = 8 * _MIB


class ForwardSchedule(NamedTuple):
    """What the forward schedules for rows spread evenly over the groups (see estimated_seconds)."""

    eb: int  # experts per weight block
    kp: int  # K and N padded to the tiles
    np_: int
    nk: int  # K and N tiles
    nn: int
    tiles: int  # row tiles
    active_blocks: float  # expected weight blocks with rows
    items: float  # expected (row tile, expert block) items
    rows: float  # rows the dots run on (about half a window wasted per expert and tile)


def forward_schedule(cfg: RaggedDotConfig, m: int, k: int, n: int, g: int) -> ForwardSchedule:
    """The forward's expected schedule under uniform routing: shared by the plain and the quantized cost models."""
    eb = cfg.experts_per_step if g % cfg.experts_per_step == 0 else 1
    kp, np_ = round_up(k, cfg.tk), round_up(n, cfg.tn)
    tiles = cdiv(m, cfg.tm)
    blocks = g // eb
    active_blocks = blocks * (1.0 - (1.0 - 1.0 / blocks) ** m)
    active = g * (1.0 - (1.0 - 1.0 / g) ** m)
    items = tiles + active_blocks - 1
    rows = m + (active + tiles) * (cfg.window / 2 + 8)
    return ForwardSchedule(eb, kp, np_, kp // cfg.tk, np_ // cfg.tn, tiles, active_blocks, items, rows)


def fastest_fitting(row_tiles: list[int], groups_per_step: list[int], k: int, n: int, budget: int,
                    need: Callable[[RaggedDotConfig], int], seconds: Callable[[RaggedDotConfig], float],
                    ) -> tuple[RaggedDotConfig, float, int, bool] | None:
    """(tiles, estimated seconds, VMEM bytes, weights padded) of the fastest tiling whose blocks (`need`) fit
    `budget`, ties to the smaller; K and N tiles that need no padded weights first (padded weights, a copy per call,
    only when nothing unpadded fits); None when nothing fits. Shared by the plain and the quantized forward."""
    for padded in (False, True):
        best, best_key = None, None
        for tm in row_tiles:
            for eb in groups_per_step:
                for tk in lane_tiles(k, padded):
                    for tn in lane_tiles(n, padded):
                        cfg = RaggedDotConfig(tm=tm, tk=tk, tn=tn, experts_per_step=eb)
                        bytes_ = need(cfg)
                        if bytes_ > budget:
                            continue
                        key = (seconds(cfg), bytes_)
                        if best_key is None or key < best_key:
                            best, best_key = cfg, key
        if best is not None:
            return best, best_key[0], best_key[1], padded
    return None


def raised_vmem_limit(chip: ChipFacts) -> int:
    """The scoped-VMEM limit a kernel whose blocks pass the default asks for: the chip's VMEM less the compiler's
    reserve (never below the default)."""
    return max(chip.scoped_vmem_bytes, chip.vmem_bytes - _COMPILER_RESERVE)


def with_vmem_limit(cfg: RaggedDotConfig, need: int, itemsize: int, chip: ChipFacts) -> RaggedDotConfig:
    """cfg with a raised vmem_limit_bytes (the chip's VMEM less the compiler's reserve) when its blocks (`need`)
    pass the share of the default scoped VMEM they may fill (usable_vmem's for their operand size, at most
    chips.VMEM_BUDGET_FRACTION: the rest is Mosaic's), else cfg as it is."""
    if need > min(usable_vmem(itemsize, chip.scoped_vmem_bytes), chip.scoped_vmem_bytes * VMEM_BUDGET_FRACTION):
        return dataclasses.replace(cfg, vmem_limit_bytes=raised_vmem_limit(chip))
    return cfg


#: Calibrated against published measured TPU times (kernel-hub's bench/records/tpu_calibration.json): the bandwidth
#: a streamed copy reaches (3.21 of 3.685 TB/s on a TPU7x core) and a grid step's fixed cost on top of its MXU work.
STREAM_FRACTION = 3.21e12 / 3.685e12
CALIBRATED_STEP_SECONDS = 0.3286e-6


def pipeline_seconds(hbm_bytes: float, flops: float, steps: float, chip: ChipFacts) -> float:
    """A pipelined kernel's time: its DMAs stream under the steps, each step's fixed cost adds to its MXU work, and
    one step's worth of the shorter side is exposed (the first fetch, or the last step's compute)."""
    dma = hbm_bytes / (chip.hbm_bytes_per_s * STREAM_FRACTION)
    compute = flops / chip.bf16_flops_per_s + steps * CALIBRATED_STEP_SECONDS
    return max(dma, compute) + min(dma, compute) / max(steps, 1.0)


def estimated_seconds(cfg: RaggedDotConfig, m: int, k: int, n: int, g: int, itemsize: int, chip: ChipFacts) -> float:
    """The forward's time on `chip` for rows spread evenly over the groups (a uniform routing):
    pipeline_seconds of its HBM bytes, MXU FLOPs and steps, counted as the kernel schedules them.

    Items are the (row tile, expert block) pairs with rows; a weight block is fetched when the block changes
    (every step when K takes several); an lhs tile when the tile changes (every step when K takes several);
    dots run on row windows from each expert's first row (about half a window wasted per expert and tile)."""
    eb, kp, np_, nk, nn, tiles, active_blocks, items, rows = forward_schedule(cfg, m, k, n, g)
    rhs = (active_blocks if nk == 1 else items) * eb * kp * np_
    lhs = (tiles if nk == 1 else items) * cfg.tm * kp * nn
    out = tiles * cfg.tm * np_
    hbm = (rhs + lhs + out) * itemsize
    passes = 6 if itemsize == 4 else 1  # an f32 dot at HIGHEST precision: six bf16 MXU passes
    flops = 2.0 * rows * kp * np_ * passes
    return pipeline_seconds(hbm, flops, items * nk * nn, chip)


def choose_config(
    m: int,
    k: int,
    n: int,
    g: int,
    dtype: object = "bfloat16",
    *,
    chip: ChipFacts | None = None,
    vmem_budget_bytes: int | None = None,
) -> tuple[RaggedDotConfig, str]:
    """The forward's tiles and why: the fastest by estimated_seconds among those whose blocks fit the chip's VMEM,
    with K and N tiles that need no padded weights (whole dims, or multiples of 128 dividing them) when any fits.

    Why each knob: a grid step costs ~0.35 us however little it moves, so decode (a few rows per expert) wants
    several experts' weights per step (experts_per_step) and prefill wants large row tiles; row windows keep a
    large row tile from multiplying other experts' rows. The budget is chips.tile_budget_bytes, 3/4 of the chip's
    physical VMEM on every generation (the scoped limit is raised to fit, `vmem_limit_bytes`; v4: 12 of its 16 MiB,
    the rest is Mosaic's), or `vmem_budget_bytes` when given; an unknown chip gets 3/4 of 16 MiB, which every
    generation's default allows."""
    chip = chip or UNKNOWN_CHIP
    itemsize = _itemsize(dtype)
    sublanes = 16 if itemsize == 2 else 8
    if m <= 128:
        row_tiles = [max(sublanes, round_up(m, sublanes))]
    else:
        row_tiles = [t for t in (128, 256, 512, 1024, 2048) if t < round_up(m, 128) * 2 and t <= round_up(m, 128)]
    groups_per_step = [e for e in (1, 2, 4, 8, 16, 32) if e <= g and g % e == 0]
    physical = vmem_budget_bytes if vmem_budget_bytes is not None else tile_budget_bytes(chip)
    budget = usable_vmem(itemsize, physical)
    found = fastest_fitting(row_tiles, groups_per_step, k, n, budget,
                            lambda cfg: vmem_bytes(cfg, itemsize, itemsize, cdiv(k, cfg.tk)),
                            lambda cfg: estimated_seconds(cfg, m, k, n, g, itemsize, chip))
    if found is not None:
        best, seconds, need, padded = found
        why = (f"fastest estimate on {chip.name} ({seconds * 1e6:.1f} us for an even routing) whose blocks "
               f"({need / _MIB:.1f} MiB) fit {budget / _MIB:.1f} MiB of VMEM"
               + ("; weights padded: no unpadded tiling fits" if padded else ""))
        return with_vmem_limit(best, need, itemsize, chip), why
    tm = row_tiles[0]
    return RaggedDotConfig(tm=tm, tk=128, tn=128), "nothing fits the VMEM budget: the smallest tiles"


def default_config(
    m: int,
    k: int,
    n: int,
    g: int,
    dtype: object = "bfloat16",
    *,
    vmem_budget_bytes: int | None = None,
    chip: ChipFacts | None = None,
) -> RaggedDotConfig:
    """The forward's tiles (choose_config without its reason)."""
    return choose_config(m, k, n, g, dtype, chip=chip, vmem_budget_bytes=vmem_budget_bytes)[0]
