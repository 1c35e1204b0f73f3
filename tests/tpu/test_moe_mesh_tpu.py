"""moe_experts compiled by the real TPU compiler (libtpu in .venv-tpu, a subprocess) for a mock 8-chip slice, v6e-8
and v5e-8, at Qwen3-30B-A3B's geometry, decode batch 64: expert-parallel over 8 chips, 4x2 (expert x tensor) and the
same layer on one chip (4x2 on v6e only, to keep the test short; bench/moe_mesh.py compiles every layout
on both); per-chip memory from the compiler against the weights worked out by hand, the whole model
against HBM, and the modeled step time. Skips, with the reason, only where the TPU environment is missing.
"""

from __future__ import annotations

import pytest

from kernel_hub.tpu.env import TpuEnvironmentError, tpu_env
from tpu_cost_model.mesh import mesh_rows, whole_model

H, INTER, E, K, T, LAYERS = 2048, 768, 128, 8, 64, 48  # Qwen3-30B-A3B, decode 64
LAYER_WEIGHTS = 3 * H * INTER * E * 2  # gate, up and down of every expert, bf16: 1.21 GB
ACTIVATIONS = T * H * 2 + 2 * T * K * 4  # x (bf16), topk_ids and topk_weights (4-byte)
SMALL_PADDING = 64 * 2**10  # the compiler pads the small [64, 8] operands to its tiles


@pytest.fixture(scope="module")
def rows() -> dict:
    try:
        env = tpu_env()
    except TpuEnvironmentError as exc:
        pytest.skip(str(exc))
    common = {"phases": {"decode": T}, "grad_layouts": ("ep8",), "env": env}
    found = mesh_rows(("v6e",), ("qwen3_30b_a3b",), layouts=("1chip", "ep8", "ep4xtp2"), **common)
    found += mesh_rows(("v5e",), ("qwen3_30b_a3b",), layouts=("1chip", "ep8"), **common)
    return {(r["generation"], r["layout"]): r for r in found}


def test_every_layout_compiles_for_v5e_8_and_v6e_8(rows):
    assert set(rows) == {("v6e", "1chip"), ("v6e", "ep8"), ("v6e", "ep4xtp2"), ("v5e", "1chip"), ("v5e", "ep8")}
    for key, r in rows.items():
        assert r["compiled"], (key, r["error"])


def test_training_backward_compiles_on_the_mesh(rows):
    """The gradients in x, topk_weights and both weights (the Pallas gmm + tgmm inside the shard_map): each chip
    returns its own experts' weight gradients, no temporary copy of them."""
    for gen in ("v5e", "v6e"):
        r = rows[(gen, "ep8")]
        assert r["bwd_compiled"], r["bwd_error"]
        assert r["bwd_output_bytes"] >= LAYER_WEIGHTS // 8 and r["bwd_temp_bytes"] < 8 * 2**20


def test_per_chip_memory_is_an_eighth_of_the_weights(rows):
    for gen in ("v5e", "v6e"):
        one, ep8 = rows[(gen, "1chip")], rows[(gen, "ep8")]
        assert 0 <= one["argument_bytes"] - LAYER_WEIGHTS - ACTIVATIONS < SMALL_PADDING
        split = [ep8, rows[(gen, "ep4xtp2")]] if gen == "v6e" else [ep8]
        for r in split:  # 16 whole experts, or 32 experts' halves of I: the same bytes per chip
            assert 0 <= r["argument_bytes"] - LAYER_WEIGHTS // 8 - ACTIVATIONS < SMALL_PADDING
            assert r["temp_bytes"] < 8 * 2**20  # decode: no copy of the weights
        # 48 layers: 54 GiB on one chip (fits neither), 6.75 GiB per chip on 8
        assert not one["fits_hbm"] and one["model_bytes_per_chip"] > LAYERS * LAYER_WEIGHTS
        assert ep8["fits_hbm"] and ep8["model_bytes_per_chip"] < ep8["hbm_bytes"] / 2


def test_model_splits_compute_and_collective(rows):
    for gen in ("v5e", "v6e"):
        one, ep8 = rows[(gen, "1chip")], rows[(gen, "ep8")]
        assert ep8["scheme"] == "psum" and ep8["rows"] == T * K
        assert ep8["collective_bytes"] == 2 * 7 / 8 * T * H * 2  # one all-reduce of bf16 [64, 2048]
        assert ep8["collectives"] == ["all_reduce x8 448 KiB"]
        assert one["collective_bytes"] == 0
        # the busiest chip reads its 16 experts' weights (150 MiB) once: at least that over HBM bandwidth
        hbm = {"v5e": 819e9, "v6e": 1640e9}[gen]
        assert ep8["kernel_hbm_bytes"] >= LAYER_WEIGHTS // 8 and ep8["kernels_s"] >= LAYER_WEIGHTS / 8 / hbm
        assert ep8["modeled_s"] == pytest.approx(ep8["kernels_s"] + ep8["glue_s"] + ep8["collective_bandwidth_s"]
                                                 + ep8["collective_latency_s"])
        assert 4 < one["modeled_s"] / ep8["modeled_s"] < 8  # the weights split 8 ways, plus the collective


def test_whole_model_extrapolation_by_hand():
    row = {"compiled": True, "layers": 48, "argument_bytes": 100, "temp_bytes": 7, "output_bytes": 3,
           "weight_bytes": 90, "hbm_bytes": 4000}
    assert whole_model(row) == {"layer_bytes_per_chip": 110, "model_bytes_per_chip": 48 * 90 + 20, "fits_hbm": False}
    assert whole_model({**row, "compiled": False}) == {}
