"""Which blocks a ragged paged attention call runs with, and why: `config=` fields, else the environment variable,
else the release's tuned table for the chip the arrays live on, else a VMEM-safe choice from the shapes.

The chip comes from the arrays' device kind (config.device_kind_of), never from `pltpu.get_tpu_info()` (which breaks
CPU interpret mode and ties tracing to one chip). The fallback (config.paged_blocks) sizes the blocks against that
chip's VMEM budget (config.vmem_plan; 16 MiB, the smallest scoped default, for an unknown chip).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from ._vendor.chips import chip_for_device_kind
from .config import MIXED_SUB_Q, AttentionConfig, PagedBlocks, decode_items, paged_blocks, paged_step_vmem_bytes
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
    sub_q: int = 0  # tokens a mixed item computes at a time (its sub-blocks); 0: block_q's own (min(block_q, 32))
    items: int = 1  # decode (block_q 1): work items per grid step (config.decode_items, or config.paged_items)


def length_bucket(positions: int) -> int:
    """Positions per sequence rounded up to a power of two (at least 128): the table's length key."""
    bucket = 128
    while bucket < positions:
        bucket *= 2
    return bucket


def tuning_key(generation: str, sh: PagedShapes, q_dtype: str, kv_dtype: str) -> tuple:
    """(generation, page size, q dtype, cache dtype, q heads, kv heads, head dim, length bucket): the table key."""
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


def key_text(key: tuple) -> str:
    return "/".join(str(k) for k in key)


def entry_vmem_bytes(key: tuple, block_q: int, pages_per_block: int, itemsize: int) -> int:
    """VMEM estimate of one kernel step with an entry's blocks (config.paged_vmem_bytes): the key fixes the heads,
    head dim and page size, so the entry alone decides whether it fits its chip."""
    _, page_size, _, _, q_heads, kv_heads, head_dim, _ = key
    return paged_step_vmem_bytes(block_q, q_heads // kv_heads, pages_per_block * page_size, kv_heads, head_dim,
                                 itemsize)


def choose_blocks(sh: PagedShapes, q_dtype: str, kv_dtype: str, itemsize: int, device_kind: str | None,
                  vmem_budget_bytes: int, config: AttentionConfig | None = None,
                  environ: Mapping[str, str] | None = None, table: Mapping[tuple, Sequence] = TUNED,
                  interpreted: bool = False) -> Choice:
    """The call's (block_q, pages_per_block, sub-block, decode items per step) and where they came from. A
    decode-only batch (one new token per sequence on average) keeps block_q 1 whatever the source, so it runs as one
    pass of one-token items, several a grid step (config.decode_items). block_q (tokens per work item: how many
    queries share each kv block read) is the tuned entry's; a mixed item computes its rows in sub-blocks of at
    most MIXED_SUB_Q tokens and at most the batch's mean new tokens rounded up, so a batch of short chunks computes
    no padding rows while a long chunk still reads each kv block once per block_q tokens. A tuned entry whose VMEM
    estimate passes the budget (a budget that changed under a shipped table) is not used. `interpreted` (the call
    runs in Pallas' interpreter, not on a TPU): one decode item a step unless `config` says otherwise, since an
    interpreted step has no fixed cost for several items to share and each item is another copy of the body to
    trace and compile."""
    environ = os.environ if environ is None else environ
    auto: PagedBlocks = paged_blocks(sh.tokens, sh.max_seqs, sh.group, sh.page_size, sh.pages_per_seq,
                                     sh.kv_heads, sh.head_dim, itemsize, sh.window, vmem_budget_bytes)
    block_q, ppb = auto.block_q, auto.pages_per_block
    chip = chip_for_device_kind(device_kind)
    if chip is None:
        source = f"fallback: no tuned blocks for device kind {device_kind!r}; {auto.reason}"
    else:
        key = tuning_key(chip.name, sh, q_dtype, kv_dtype)
        entry = table.get(key)
        if entry is None:
            source = f"fallback: no tuned entry for {key_text(key)}; {auto.reason}"
        elif entry_vmem_bytes(key, entry[0], entry[1], itemsize) > vmem_budget_bytes * 5 // 8:
            source = f"fallback: tuned entry {key_text(key)} passes 5/8 of the VMEM budget; {auto.reason}"
        else:
            block_q, ppb = entry[0], entry[1]
            source = f"tuned {key_text(key)}"
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
    ppb = min(ppb, sh.pages_per_seq)
    items = 1
    if block_q == 1 and cfg.paged_items:
        items = cfg.paged_items
    elif block_q == 1 and interpreted:
        source += "; one decode item a step, interpreted"
    elif block_q == 1:
        items = decode_items(sh.tokens, sh.group, ppb * sh.page_size, sh.kv_heads, sh.head_dim, itemsize,
                             vmem_budget_bytes)[0]
    return Choice(block_q, ppb, source, min(block_q, MIXED_SUB_Q, auto.block_q), items)
