"""moe_routed_experts' fused kernel expert-parallel over 8 simulated CPU devices (tests/moe_routed_mesh_worker.py, a
subprocess): every device routes all tokens and runs its two local experts, the partial outputs and each device's
partial sums of another output (reduce_with) summed in one all-reduce; against the float64 layer and the same op on
one device."""

from __future__ import annotations

import pytest

from tests.simulated_devices import run_worker


@pytest.fixture(scope="module")
def result():
    return run_worker("moe_routed_mesh_worker.py")


def test_the_fused_kernel_ran(result):
    assert "routing: one kernel" in result["why"]


def test_mesh_matches_float64_and_one_device(result):
    assert result["finite"]
    assert result["mesh_vs_float64"] < 1e-4 and result["one_vs_float64"] < 1e-4
    assert result["mesh_vs_one"] < 1e-4


def test_the_residual_sum_and_the_ridden_sum(result):
    assert result["total_exact"]
    assert result["summed_shape"] == [13, 24] and result["summed_err"] < 1e-5


def test_a_shared_mlp_split_over_the_devices(result):
    """Gemma 4's form: (out, x + r, the shared MLP's output) from the fused kernel on the mesh equal the two ops on
    the mesh and on one device."""
    assert result["shared_outputs"] == 3 and result["shared_scale"] > 0.1
    assert result["shared_fused_vs_two_ops"] < 1e-4 and result["shared_mesh_vs_one"] < 1e-4
