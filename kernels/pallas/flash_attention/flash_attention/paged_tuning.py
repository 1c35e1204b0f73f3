"""Which blocks a ragged paged attention call runs with, and why: `config=` fields, else the environment variable,
else the release's tuned table for the chip the arrays live on, else a VMEM-safe choice from the shapes.

The chip comes from the arrays' device kind (config.device_kind_of), never from `pltpu.get_tpu_info()` (which breaks
CPU interpret mode and ties tracing to one chip). The fallback (config.paged_blocks) sizes the blocks against that
chip's VMEM budget (config.vmem_plan; 16 MiB, the smallest scoped default, for an unknown chip).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from ._vendor.chips import chip_for_device_kind
from .config import AttentionConfig, PagedBlocks, paged_blocks
from .paged_checks import PagedShapes
from .paged_tuned_table import TUNED

#: "block_q,pages_per_block" (e.g. "16,8"): overrides the table and the fallback for every call in the process;
#: `config=` fields still win.
ENV_VAR = "FLASH_ATTENTION_PAGED_BLOCKS"


class PagedBlocksError(ValueError):
    """An override of the paged blocks that cannot be used; the message names it and the expected form."""


@dataclasses.dataclass(frozen=True)
class Choice:
    block_q: int
    pages_per_block: int
    source: str  # "config", "env", "tuned <key>" or "fallback: <why>"


def length_bucket(positions: int) -> int:
    """Positions per sequence rounded up to a power of two (at least 128): the table's length key."""
    bucket = 128
    while bucket < positions:
        bucket *= 2
    return bucket


def tuning_key(generation: str, sh: PagedShapes, q_dtype: str, kv_dtype: str) -> tuple:
    return (generation, sh.page_size, q_dtype, kv_dtype, sh.q_heads, sh.kv_heads, sh.head_dim,
            length_bucket(sh.pages_per_seq * sh.page_size))


def _from_env(environ: Mapping[str, str]) -> tuple[int, int] | None:
    text = environ.get(ENV_VAR, "").strip()
    if not text:
        return None
    parts = text.split(",")
    try:
        block_q, ppb = (int(p) for p in parts)
    except ValueError:
        raise PagedBlocksError(f"{ENV_VAR}={text!r}: expected 'block_q,pages_per_block', two positive integers "
                               "such as '16,8'") from None
    if block_q < 1 or ppb < 1:
        raise PagedBlocksError(f"{ENV_VAR}={text!r}: both numbers must be >= 1")
    return block_q, ppb


def choose_blocks(sh: PagedShapes, q_dtype: str, kv_dtype: str, itemsize: int, device_kind: str | None,
                  vmem_budget_bytes: int, config: AttentionConfig | None = None,
                  environ: Mapping[str, str] | None = None, table: Mapping[tuple, tuple[int, int]] = TUNED) -> Choice:
    """The call's (block_q, pages_per_block) and where they came from. A decode-only batch (one new token per
    sequence on average) keeps block_q 1 whatever the source, so it runs as one pass of one-token items."""
    environ = os.environ if environ is None else environ
    auto: PagedBlocks = paged_blocks(sh.tokens, sh.max_seqs, sh.group, sh.page_size, sh.pages_per_seq,
                                     sh.kv_heads, sh.head_dim, itemsize, sh.window, vmem_budget_bytes)
    block_q, ppb, source = auto.block_q, auto.pages_per_block, f"fallback: {auto.reason}"
    chip = chip_for_device_kind(device_kind)
    key = tuning_key(chip.name, sh, q_dtype, kv_dtype) if chip is not None else None
    if key is not None and key in table:
        block_q, ppb = table[key]
        source = "tuned " + "/".join(str(k) for k in key)
    override = _from_env(environ)
    if override is not None:
        block_q, ppb = override
        source = f"env {ENV_VAR}"
    cfg = config or AttentionConfig()
    if cfg.paged_block_q or cfg.paged_pages_per_block:
        block_q, ppb = cfg.paged_block_q or block_q, cfg.paged_pages_per_block or ppb
        source = "config"
    if auto.block_q == 1 and not cfg.paged_block_q:
        block_q = 1
    return Choice(block_q, min(ppb, sh.pages_per_seq), source)
