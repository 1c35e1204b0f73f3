"""The quantized forward at decode: the chosen tiles compute narrow row windows and, where one expert a step would
leave the weight DMA waiting on the dequantization (v7x), group several experts a step; the numbers still match the
float64 reference of the dequantized weights (quant_testutil.py) with empty groups, one-row groups, an expert's rows
straddling a window and a row tile, and rows past the groups; fp8 block scales are arranged per tile."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd
from quant_testutil import quantized_inputs, reference
from ragged_dot._vendor.chips import CHIPS
from ragged_dot.pallas.config import STREAM_FRACTION, forward_schedule
from ragged_dot.pallas.quant import (
    STEP_SECONDS_HIGH,
    arrange_block_scales,
    choose_quant_config,
    decode_window,
    dequant_vector_ops,
    vector_ops_per_s,
)

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error

# 16 experts, 60 of 64 rows routed: empty groups, groups of 1, a group of 13 crossing a 16-row window
SIZES = [3, 0, 1, 13, 4, 0, 0, 7, 2, 5, 1, 0, 9, 6, 0, 9]


@pytest.mark.parametrize("m,g,default,expect", [(512, 128, 128, 16), (64, 16, 64, 16), (96, 4, 96, 48),
                                                (4096, 128, 128, 64), (32768, 128, 128, 128), (8, 0, 16, 16),
                                                (24, 4, 24, 24)])  # a 24-row tile keeps its one window
def test_window_is_twice_the_average_rows_when_narrower(m, g, default, expect):
    cfg = decode_window(rd.RaggedDotConfig(tm=max(default, 16)), m, g)
    assert cfg.window == expect
    assert cfg.window <= cfg.tm
    assert cfg.row_window is None or (cfg.row_window % 16 == 0 and cfg.row_window < default)


@pytest.mark.parametrize("block_scales", [False, True])
def test_decode_choice_uses_a_narrow_window(block_scales):
    cfg, _ = choose_quant_config(512, 2048, 1536, 128, "bfloat16", block_scales)
    assert cfg.window == 16 < cfg.tm
    prefill, _ = choose_quant_config(4096 * 8, 2048, 1536, 128, "bfloat16", block_scales)
    assert prefill.window == min(prefill.tm, 128)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_decode_window_matches_float64_dequantized(fmt, dtype):
    m, k, n = 64, 256, 256
    (lhs, q, s, gs), (lhs64, w64) = quantized_inputs(m, k, n, SIZES, fmt, dtype, seed=7)
    cfg = rd.RaggedDotConfig(tm=32, tk=128, tn=128, row_window=16)  # windows narrower than the row tile
    out = rd.ragged_dot(lhs, q, gs, rhs_scale=s, implementation="pallas", interpret=True, config=cfg)
    ref = reference(lhs64, w64, SIZES)
    assert not np.isnan(np.asarray(out.astype(jnp.float32))).any()
    err = relative_error(out, ref)
    assert err <= TOL[dtype], f"{fmt} {dtype}: relative error {err:.2e}"
    assert not np.asarray(out.astype(jnp.float32))[sum(SIZES):].any(), "rows past the groups must be zero"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", ["int8", "fp8"])
@pytest.mark.parametrize("tn,experts", [(256, 4), (128, 2)])  # one N tile (scales reshaped) and two (transposed)
def test_grouped_experts_with_narrow_windows_match_float64(fmt, dtype, tn, experts):
    m, k, n = 64, 256, 256
    (lhs, q, s, gs), (lhs64, w64) = quantized_inputs(m, k, n, SIZES, fmt, dtype, seed=11 + experts)
    cfg = rd.RaggedDotConfig(tm=64, tk=128, tn=tn, experts_per_step=experts, row_window=16)
    out = rd.ragged_dot(lhs, q, gs, rhs_scale=s, implementation="pallas", interpret=True, config=cfg)
    got = np.asarray(out.astype(jnp.float32))
    assert np.isfinite(got).all()
    err = relative_error(out, reference(lhs64, w64, SIZES))
    assert err <= TOL[dtype], f"{fmt} {dtype} tn={tn} experts={experts}: relative error {err:.2e}"
    assert not got[sum(SIZES):].any(), "rows past the groups must be zero"


@pytest.mark.parametrize("k,n,tk,tn", [(256, 384, 128, 384), (384, 256, 384, 128), (200, 136, 200, 136)])
def test_arranged_block_scales_are_each_tiles_blocks(k, n, tk, tn):
    """Block (e, t, u) of the arranged scales is expert e's scales of N tile t and K tile u, zero past K and N,
    whether the arrangement is a reshape (one N tile) or a transpose."""
    rng = np.random.default_rng(k + n)
    g, kb, nb = 3, -(-k // 128), -(-n // 128)
    scale = rng.uniform(0.5, 2.0, (g, kb, nb)).astype(np.float32)
    kp, np_ = -(-k // tk) * tk, -(-n // tn) * tn
    got = np.asarray(arrange_block_scales(jnp.asarray(scale), kp, np_, tk, tn))
    bk, bn = -(-tk // 128), -(-tn // 128)
    assert got.shape == (g, np_ // tn, kp // tk, bk, bn)
    padded = np.zeros((g, kp // tk * bk, np_ // tn * bn), np.float32)
    padded[:, :kb, :nb] = scale
    for t in range(np_ // tn):
        for u in range(kp // tk):
            np.testing.assert_array_equal(got[:, t, u], padded[:, u * bk:(u + 1) * bk, t * bn:(t + 1) * bn])


@pytest.mark.parametrize("block_scales", [False, True])
@pytest.mark.parametrize("k,n", [(2048, 1536), (768, 2048)])  # Qwen3-30B-A3B's gate_up and down
def test_v7x_decode_hides_dequantization_under_the_weight_dma(block_scales, k, n):
    """At decode on v7x one expert a step would leave the weight DMA waiting on the upcasts and step costs: the
    choice's estimated vector work plus step costs stay under its DMA time, at the estimate's slow step cost."""
    chip = CHIPS["v7x"]
    m, g = 512, 128
    cfg, _ = choose_quant_config(m, k, n, g, "bfloat16", block_scales, chip=chip)
    eb, kp, np_, nk, nn, _tiles, active_blocks, items, rows = forward_schedule(cfg, m, k, n, g)
    dma = (active_blocks * eb * kp * np_) / (chip.hbm_bytes_per_s * STREAM_FRACTION)
    vector = dequant_vector_ops(cfg, m, g, rows, kp, np_, block_scales) / vector_ops_per_s(chip)
    assert vector + items * nk * nn * STEP_SECONDS_HIGH <= dma, cfg
    assert cfg.window == 16


def test_vector_rate_follows_the_mxu_clock():
    """4096 element ops a cycle at the clock the bf16 peak and MXU geometry give (v5e 1.5 GHz, v7x about 2.2)."""
    assert vector_ops_per_s(CHIPS["v5e"]) == pytest.approx(4096 * 1.503e9, rel=1e-3)
    assert vector_ops_per_s(CHIPS["v7x"]) == pytest.approx(4096 * 2.2e9, rel=0.01)
