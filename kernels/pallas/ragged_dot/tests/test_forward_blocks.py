"""The forward's multi-expert weight blocks, row windows and chip-aware tiles: interpreted against NumPy, and the
tile choice's pure decisions (with their reason)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd
from quant_testutil import reference
from ragged_dot._vendor.chips import CHIPS, chip_for_device_kind
from ragged_dot.pallas.config import (
    STREAM_FRACTION,
    UNKNOWN_CHIP,
    choose_config,
    estimated_seconds,
    usable_vmem,
    vmem_bytes,
)
from ragged_dot_testutil import make_inputs

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error


def _numpy_reference(lhs, rhs, sizes) -> np.ndarray:
    """Row r of group g gets lhs[r] @ rhs[g] in float64; rows past sum(sizes) are zero."""
    return reference(np.asarray(jnp.asarray(lhs, jnp.float32), np.float64),
                     np.asarray(jnp.asarray(rhs, jnp.float32), np.float64), sizes)


# (name, M, K, N, sizes, config): blocks of 2 or 4 experts, row windows smaller than the tile, K in one step (no
# accumulator) and in several, empty groups inside a block, one group holding every row, M not a tile multiple
CASES = [
    ("blocks_of_2_windows", 70, 128, 128, [9, 0, 0, 20, 13, 0, 28, 0],
     rd.RaggedDotConfig(tm=32, tk=128, tn=128, experts_per_step=2, row_window=16)),
    ("blocks_of_4_k_steps", 64, 256, 128, [3, 0, 17, 5, 0, 0, 0, 30],
     rd.RaggedDotConfig(tm=64, tk=128, tn=128, experts_per_step=4, row_window=16)),
    ("one_group_all_rows", 48, 128, 256, [0, 0, 48, 0],
     rd.RaggedDotConfig(tm=48, tk=128, tn=128, experts_per_step=2, row_window=16)),
    ("all_empty", 40, 128, 128, [0, 0, 0, 0], rd.RaggedDotConfig(tm=16, tk=128, tn=128, experts_per_step=4)),
    ("rows_past_sum_odd_groups", 56, 136, 128, [7, 11, 0, 5, 9],  # 5 groups: blocks of 2 fall back to 1
     rd.RaggedDotConfig(tm=32, tk=136, tn=128, experts_per_step=2, row_window=16)),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_blocks_match_numpy(case, dtype):
    _, m, k, n, sizes, cfg = case
    lhs, rhs, gs = make_inputs(m, k, n, sizes, dtype, seed=len(sizes) + m)
    out = rd.ragged_dot(lhs, rhs, gs, implementation="pallas", interpret=True, config=cfg)
    want = _numpy_reference(lhs, rhs, sizes)
    got = np.asarray(jnp.asarray(out, jnp.float32))
    assert np.isfinite(got).all()
    assert rel_error(got, want) <= TOL[dtype]
    assert not got[sum(sizes):].any()  # rows past sum(group_sizes) come out as zeros


def test_gradients_with_block_config_match_reference():
    """The backward runs one expert per step whatever the forward's blocks: gradients still right."""
    sizes = [9, 0, 14, 9]
    lhs, rhs, gs = make_inputs(32, 128, 128, sizes, "float32", seed=5)
    cfg = rd.RaggedDotConfig(tm=32, tk=128, tn=128, experts_per_step=2, row_window=16)
    ours = jax.grad(lambda a, b: jnp.sum(rd.ragged_dot(a, b, gs, implementation="pallas", interpret=True,
                                                       config=cfg) ** 2), (0, 1))(lhs, rhs)
    a, b = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out = _numpy_reference(lhs, rhs, sizes)
    d_lhs, d_rhs, start = np.zeros_like(a), np.zeros_like(b), 0
    for g, size in enumerate(sizes):  # d(sum(out^2)) = 2 out; per group: dA = 2 out B^T, dB = A^T 2 out
        rows = slice(start, start + size)
        d_lhs[rows] = 2 * out[rows] @ b[g].T
        d_rhs[g] = a[rows].T @ (2 * out[rows])
        start += size
    assert rel_error(np.asarray(ours[0]), d_lhs) <= TOL["float32"]
    assert rel_error(np.asarray(ours[1]), d_rhs) <= TOL["float32"]


def test_config_rejects_a_window_that_does_not_divide_the_tile():
    with pytest.raises(ValueError, match="row_window"):
        rd.RaggedDotConfig(tm=64, row_window=40)
    with pytest.raises(ValueError, match="experts_per_step"):
        rd.RaggedDotConfig(experts_per_step=0)


def test_chip_facts_from_device_kinds():
    assert chip_for_device_kind("TPU v6 lite") is CHIPS["v6e"]
    assert chip_for_device_kind("TPU v5 lite") is CHIPS["v5e"]
    assert chip_for_device_kind("TPU7x") is CHIPS["v7x"]
    assert chip_for_device_kind("cpu") is None and chip_for_device_kind(None) is None


QWEN = {"decode": (512, 2048, 1536, 128), "prefill": (32768, 2048, 1536, 128)}


@pytest.mark.parametrize("gen", ["v5e", "v6e", "v7x"])
def test_tiles_use_the_chips_vmem_and_say_why(gen):
    """Each chip's tiles fit 3/4 of its VMEM (the scoped limit raised when they pass the default), decode streams the
    active experts' weights within 5% of a streamed copy's time (the calibrated pipeline: its steps run under the
    DMAs), prefill within 15% of its floor; the reason names the chip."""
    chip = CHIPS[gen]
    for phase, (m, k, n, g) in QWEN.items():
        cfg, why = choose_config(m, k, n, g, "bfloat16", chip=chip)
        need = vmem_bytes(cfg, 2, 2, -(-k // cfg.tk))
        assert need <= usable_vmem(2, chip.vmem_bytes * 3 // 4)
        assert gen in why and "MiB" in why
        if need > usable_vmem(2, chip.scoped_vmem_bytes):
            assert cfg.vmem_limit_bytes is not None and need < cfg.vmem_limit_bytes <= chip.vmem_bytes
        if phase == "decode":
            active = g * (1.0 - (1.0 - 1.0 / g) ** m)  # experts with rows under a uniform routing
            stream = active * k * n * 2 / (chip.hbm_bytes_per_s * STREAM_FRACTION)
            assert stream <= estimated_seconds(cfg, m, k, n, g, 2, chip) <= 1.05 * stream, (gen, cfg)
        else:  # prefill: within 15% of the larger of moving everything once and the MXU work at peak
            floor = max((g * k * n + m * k + m * n) * 2 / (chip.hbm_bytes_per_s * STREAM_FRACTION),
                        2.0 * m * k * n / chip.bf16_flops_per_s)
            assert floor <= estimated_seconds(cfg, m, k, n, g, 2, chip) <= 1.15 * floor, (gen, cfg)
    # an unknown chip (CPU interpret) keeps within every generation's 16 MiB default, no raised limit
    cfg = rd.default_config(*QWEN["prefill"])
    assert vmem_bytes(cfg, 2, 2, -(-2048 // cfg.tk)) <= usable_vmem(2, UNKNOWN_CHIP.vmem_bytes)
    assert cfg.vmem_limit_bytes is None
