"""Tile sizes for the attention kernels, chosen by a heuristic from shapes and injected chip facts.

Chip facts (the scoped-VMEM budget) are arguments, never queried: `pltpu.get_tpu_info()` at trace time
breaks CPU interpret mode and ties tracing to one chip generation.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

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
    decode_block_kv: cache positions per grid step of the decode kernel (multiple of 128 or >= cache).
    cpu_block_q: query rows per chunk in the "cpu" path; each chunk only reads the keys its causal or
      sliding-window band can reach (static skipping), and bounds the score buffer.
    vmem_limit_bytes: scoped-VMEM limit handed to Mosaic; None keeps the compiler default.
    """

    block_q: int = 128
    block_kv: int = 128
    decode_block_kv: int = 512
    cpu_block_q: int = 256
    vmem_limit_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_q", "block_kv", "decode_block_kv", "cpu_block_q"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"AttentionConfig.{name} must be positive, got {value}")


def block_for(length: int, block: int) -> tuple[int, int]:
    """(tile, padded length) for one sequence axis under the TPU block rule: either one tile spanning
    the sequence (padded to a multiple of 8), or a multiple-of-128 tile with the sequence padded to it."""
    whole = round_up(max(length, 1), 8)
    if whole <= block:
        return whole, whole
    tile = round_up(block, LANES)
    return tile, round_up(length, tile)


def vmem_bytes(block_q: int, block_kv: int, head_dim: int, itemsize: int) -> int:
    """VMEM of one forward step: double-buffered q/k/v/o blocks, f32 accumulator, m/l scratch and the
    f32 score/probability temporaries."""
    blocks = 2 * (2 * block_q + 2 * block_kv) * head_dim * itemsize
    scratch = block_q * head_dim * 4 + 2 * block_q * LANES * 4
    temps = 3 * block_q * block_kv * 4
    return blocks + scratch + temps


def default_config(
    q_len: int,
    kv_len: int,
    head_dim: int,
    dtype: object = "bfloat16",
    *,
    vmem_budget_bytes: int = DEFAULT_VMEM_BUDGET_BYTES,
) -> AttentionConfig:
    """Largest square-ish tiles (up to 512) that fit half the VMEM budget, halved until they do.

    Long sequences get 512-wide tiles: fewer grid steps amortise the ~0.35 us per-step cost, and a
    512x512 f32 score tile is 1 MiB. Short ones get one block. Half the budget leaves room for Mosaic's
    own temporaries."""
    itemsize = jnp.dtype(dtype).itemsize
    bq = min(512, round_up(q_len, 8)) if q_len > 0 else 8
    bk = min(512, round_up(kv_len, 8)) if kv_len > 0 else 8
    while vmem_bytes(bq, bk, head_dim, itemsize) > vmem_budget_bytes // 2 and max(bq, bk) > LANES:
        if bk >= bq:
            bk = max(LANES, bk // 2)
        else:
            bq = max(LANES, bq // 2)
    decode_bk = min(2048, round_up(max(kv_len, 1), 8))
    # CPU: 128-row chunks ran fastest at S=1024 on 2 cores (cache-resident scores, more band skipping);
    # longer sequences get wider chunks to keep the unrolled chunk count (compile time) near 16.
    cpu_bq = min(1024, max(128, round_up(cdiv(q_len, 16), 128)))
    return AttentionConfig(block_q=bq, block_kv=bk, decode_block_kv=decode_bk, cpu_block_q=cpu_bq)
