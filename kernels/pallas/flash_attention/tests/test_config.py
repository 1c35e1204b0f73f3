"""Tiles: frozen, legal TPU blocks, chosen within an injected VMEM budget, and no chip query at trace time."""

from __future__ import annotations

import dataclasses

import flash_attention as fa
import jax.numpy as jnp
import numpy as np
import pytest
from fa_helpers import make_inputs
from flash_attention.config import block_for, vmem_bytes
from jax.experimental.pallas import tpu as pltpu

from kernel_hub.numerics import relative_error as rel_error


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
def test_default_config_fits_the_injected_budget(budget):
    cfg = fa.default_config(8192, 8192, 256, jnp.float32, vmem_budget_bytes=budget)
    assert cfg.block_q % 128 == 0 and cfg.block_kv % 128 == 0
    assert vmem_bytes(cfg.block_q, cfg.block_kv, 256, 4) <= budget // 2 or max(cfg.block_q, cfg.block_kv) == 128
    assert fa.default_config(40, 56, 64).block_q == 40


def test_no_chip_query_at_trace_time(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("get_tpu_info called")

    monkeypatch.setattr(pltpu, "get_tpu_info", boom)
    q, k, v = make_inputs(np.random.default_rng(0), 1, 2, 1, 24, 24, 64, "float32")
    out = fa.flash_attention(q, k, v, causal=True, implementation="pallas", sm_scale=0.3)
    assert rel_error(out, fa.reference_attention(q, k, v, causal=True, sm_scale=0.3)) <= 1e-4
