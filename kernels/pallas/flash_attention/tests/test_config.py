"""Tiles: frozen, legal TPU blocks, chosen within an injected VMEM budget, and no chip query at trace time."""

from __future__ import annotations

import dataclasses

import flash_attention as fa
import jax.numpy as jnp
import numpy as np
import pytest
from fa_helpers import make_inputs
from flash_attention.config import (
    block_for,
    decode_vmem_bytes,
    kv_transposed,
    prefill_tiles,
    sub_block,
    vmem_bytes,
    vmem_plan,
)
from jax.experimental.pallas import tpu as pltpu

from kernel_hub.verify.numerics import relative_error as rel_error


def test_config_is_frozen_and_checked():
    cfg = fa.AttentionConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.block_q = 8  # type: ignore[misc]
    with pytest.raises(ValueError):
        fa.AttentionConfig(block_kv=0)
    hash(cfg)


@pytest.mark.parametrize("length, block, expected", [(40, 128, (40, 40)), (41, 128, (48, 48)), (300, 128, (128, 384)),
                                                     (300, 100, (128, 384)), (1024, 512, (512, 1024))])
def test_block_rule(length, block, expected):
    assert block_for(length, block) == expected


@pytest.mark.parametrize("budget", [2 * 2**20, 16 * 2**20, 64 * 2**20])
@pytest.mark.parametrize("d, group", [(256, 1), (64, 8), (128, 6)])
def test_default_config_fits_the_injected_budget(budget, d, group):
    cfg = fa.default_config(8192, 8192, d, jnp.float32, kv_heads=8, group=group, vmem_budget_bytes=budget)
    assert cfg.block_q % 128 == 0 and cfg.block_kv % 128 == 0 and group % cfg.heads_per_block == 0
    smallest = max(cfg.block_q, cfg.block_kv) == 128 and cfg.heads_per_block == 1
    need = vmem_bytes(cfg.block_q, cfg.block_kv, d, 4, cfg.heads_per_block, chunk_q=sub_block(cfg.block_q, cfg.chunk_q),
                      chunk_kv=sub_block(cfg.block_kv, cfg.chunk_kv), whole_kv=cfg.block_kv >= 8192)
    assert need <= budget * 5 // 8 or smallest
    assert cfg.block_q % sub_block(cfg.block_q, cfg.bwd_block_q) == 0
    assert vmem_bytes(cfg.bwd_block_q, cfg.bwd_block_kv, d, 4) <= budget * 5 // 8 or smallest
    transposed = kv_transposed(8192, d)
    assert decode_vmem_bytes(cfg.decode_block_kv, 8, group, d, 4, transposed) <= budget * 5 // 8 \
        or cfg.decode_block_kv == 128
    assert fa.default_config(40, 56, 64).block_q == 40


def test_small_head_dims_take_several_heads_per_step():
    """At head dim 64 one head's block is less work than a grid step costs: the forward takes the whole group
    (GPT-OSS: 8 query heads per kv head) per step, and decode blocks span thousands of cache positions."""
    cfg = fa.default_config(4096, 4096, 64, jnp.bfloat16, kv_heads=8, group=8)
    assert cfg.heads_per_block == 8 and cfg.block_q * cfg.block_kv >= 256 * 1024
    assert cfg.decode_block_kv >= 2048 and kv_transposed(8192, 64) and not kv_transposed(8192, 128)
    windowed = fa.default_config(1, 8192, 64, jnp.bfloat16, kv_heads=8, group=8, window=128)
    assert windowed.decode_block_kv == 128  # a block no wider than the window


def test_no_chip_query_at_trace_time(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("get_tpu_info called")

    monkeypatch.setattr(pltpu, "get_tpu_info", boom)
    q, k, v = make_inputs(np.random.default_rng(0), 1, 2, 1, 24, 24, 64, "float32")
    out = fa.flash_attention(q, k, v, causal=True, implementation="pallas", sm_scale=0.3)
    assert rel_error(out, fa.reference_attention(q, k, v, causal=True, sm_scale=0.3)) <= 1e-4


@pytest.mark.parametrize("tile, want, expected", [(2048, 256, 256), (2048, 0, 2048), (384, 256, 128), (1000, 256, 1000),
                                                  (512, 4096, 512), (640, 300, 128)])
def test_sub_block_divides_the_tile(tile, want, expected):
    got = sub_block(tile, want)
    assert got == expected and tile % got == 0


@pytest.mark.parametrize("kind, limit", [("TPU v5 lite", 96 << 20), ("TPU v6 lite", 96 << 20), ("TPU7x", 56 << 20),
                                         ("TPU v4", None), ("cpu", None), (None, None)])
def test_vmem_plan_per_chip(kind, limit):
    budget, got, why = vmem_plan(kind)
    assert got == limit and why
    assert budget == (limit or 16 << 20)


def test_gpt_oss_prefill_takes_a_few_big_steps_on_a_big_vmem():
    """GPT-OSS-20B (64/8 heads x 64, 4096 tokens): with v7x's plan the forward holds the whole key sequence of a
    kv head and 2048 query rows of 8 heads per step (4096 / 2048 x 8 head groups = 16 steps); the default 16 MiB
    budget (unknown chip) still gets heads sharing K/V with smaller blocks."""
    budget, _, _ = vmem_plan("TPU7x")
    tiles = prefill_tiles(4096, 4096, 64, 2, 8, budget)
    assert (tiles.heads, tiles.block_q, tiles.block_kv, tiles.chunk) == (8, 2048, 4096, 256)
    assert "8 heads x 2048 x 4096" in tiles.reason
    small = prefill_tiles(4096, 4096, 64, 2, 8, 16 << 20)
    assert small.heads == 8 and small.block_q * small.block_kv < tiles.block_q * tiles.block_kv
    assert vmem_bytes(small.block_q, small.block_kv, 64, 2, 8, chunk_q=256, chunk_kv=256,
                      whole_kv=small.block_kv >= 4096) <= (16 << 20) * 5 // 8
