"""The quantized forward's decode window: at decode (a few rows an expert) the chosen tiles compute narrow row
windows, and the numbers still match the float64 reference of the dequantized weights (quant_testutil.py) with
empty groups, one-row groups, an expert's rows straddling a window and a row tile, and rows past the groups."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd
from quant_testutil import quantized_inputs, reference
from ragged_dot.pallas.quant import choose_quant_config, decode_window

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
