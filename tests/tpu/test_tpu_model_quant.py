"""The TPU cost model on the quantized ragged dot: HBM moves 1 byte a weight plus the scales, counted by hand from
the kernel's documented schedule (the same routing and work items as tests/tpu/test_tpu_model.py), not by the walker."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tpu_cost_model.schedule import kernel_cost

SDS = jax.ShapeDtypeStruct
# 512 rows over 8 groups: [0,100) [] [100,300) [300,312) [] [312,462) [462,512) []; 4 m-tiles of 128. The forward runs
# the 8 (tile, group) items with rows; lhs tiles fetched 4 times, weight blocks of 5 groups (0 2 3 5 6) once each.
SIZES = np.array([100, 0, 200, 12, 0, 150, 50, 0], np.int32)
ITEMS, ITEMS_WITH_ROWS, LHS_TILES, GROUPS = 12, 8, 4, 5
PREFETCH_BYTES = 2 * (ITEMS - 1) * 4 + (8 + 1) * 4  # packed items (tiles + groups - 1) and the groups' offsets
K, N = 256, 384


RD_LOAD = {"local": True}  # the JAX build of the source folder (conftest.py rd)


def _cost(rd, fmt: str, scale_shape: tuple[int, ...]):
    call = lambda a, b, sc, s: rd.ragged_dot(a, b, s, rhs_scale=sc, implementation="pallas", interpret=False,
                                             config=rd.RaggedDotConfig(128, K, N))
    return kernel_cost(call, SDS((512, K), jnp.bfloat16), SDS((8, K, N), fmt), SDS(scale_shape, jnp.float32), SIZES)


def test_int8_reads_one_byte_a_weight_and_each_visited_experts_channel_scales(rd):
    cost = _cost(rd, "int8", (8, 1, N))
    (call,) = cost.calls
    assert call.grid == (1, ITEMS_WITH_ROWS, 1)
    assert call.read_bytes == LHS_TILES * 128 * K * 2 + GROUPS * K * N * 1 + GROUPS * N * 4 + PREFETCH_BYTES
    assert call.write_bytes == 4 * 128 * N * 2
    assert call.flops == ITEMS_WITH_ROWS * 2 * 128 * K * N  # one 256-row chunk, one 128-row window per item
    assert cost.outside_bytes == 0  # no dequantized copy of the weights outside the kernel


def test_fp8_reads_one_byte_a_weight_and_its_block_scales(rd):
    cost = _cost(rd, "float8_e4m3fn", (8, 2, 3))
    (call,) = cost.calls
    kb, nb = K // 128, N // 128
    assert call.read_bytes == LHS_TILES * 128 * K * 2 + GROUPS * K * N + GROUPS * kb * nb * 4 + PREFETCH_BYTES
    # two 128-row chunks per window, and the [kb, nb] x [nb, N] spread of each expert's scales (FLOPs as written;
    # the MXU time counts that f32 dot's six passes)
    assert call.flops == ITEMS_WITH_ROWS * (2 * 128 * K * N + 2 * kb * nb * N)
    # outside the kernel only the tiny scales are rearranged (a pad and a transpose, each read and written), never
    # the weights
    assert cost.outside_bytes <= 4 * 8 * kb * nb * 4


def test_quantized_decode_models_about_half_the_bf16_layer(rd):
    """Qwen3-30B-A3B's gate_up at decode (64 tokens x top-8, a uniform routing) on v6e: the quantized kernel's
    modeled HBM bytes are about half the bf16 kernel's (weights dominate; scales add 4/K or 4/128^2 a weight)."""
    from tpu_cost_model.workload import routing

    gs = routing(64, 128, 8)
    m, k, n = 512, 2048, 1536
    bf16 = kernel_cost(lambda a, b, s: rd.ragged_dot(a, b, s, implementation="pallas", interpret=False),
                       SDS((m, k), jnp.bfloat16), SDS((128, k, n), jnp.bfloat16), gs, generation="v6e")
    for fmt, shape in (("int8", (128, 1, n)), ("float8_e4m3fn", (128, k // 128, n // 128))):
        q = kernel_cost(lambda a, b, sc, s: rd.ragged_dot(a, b, s, rhs_scale=sc, implementation="pallas",
                                                         interpret=False),
                        SDS((m, k), jnp.bfloat16), SDS((128, k, n), fmt), SDS(shape, jnp.float32), gs,
                        generation="v6e")
        active = int(np.count_nonzero(gs))
        assert active * k * n <= q.hbm_bytes <= 1.05 * active * k * n + 4 * m * (k + n), fmt
        assert 0.45 <= q.hbm_bytes / bf16.hbm_bytes <= 0.55, fmt
