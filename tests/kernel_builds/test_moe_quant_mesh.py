"""moe_experts on quantized expert weights over a device mesh (8 simulated CPU devices, tests/moe_quant_mesh_worker.py
in a subprocess): int8 per-channel and fp8 block scales shard with their weights over the expert axis and, along the
expert intermediate, over the tensor axis; every layout matches the float64 reference of the dequantized weights and
the one-device result, forward and gradient in x. The mesh checks that need no devices run here."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_hub import get_local_kernel
from kernel_hub.verify.numerics import TOLERANCE
from tests.simulated_devices import run_worker

HERE = Path(__file__).resolve().parents[1]

F32 = TOLERANCE["float32"]


@pytest.fixture(scope="module")
def results():
    return run_worker("moe_quant_mesh_worker.py")


def test_quantized_mesh_layouts_match_float64_and_one_device(results):
    assert results["devices"] == 8
    rows = results["rows"]
    assert {(r["format"], r["config"]) for r in rows} == {
        (f, c) for f in ("int8", "fp8") for c in ("1dev", "ep8:all_to_all", "ep4xtp2:psum", "ep4xtp2:fused")}
    for r in rows:
        assert r["fwd_error"] is not None and r["fwd_error"] <= F32, r
        assert r["vs_1dev"] <= F32 and r["grad_vs_1dev"] <= F32 and r["grad_nonzero"], r


def test_block_scales_refuse_a_split_inside_a_block():
    """fp8 blocks cannot follow a gate/up or tensor split that cuts a 128-wide block: one ValueError naming why."""
    rd = get_local_kernel(HERE.parent / "kernels/pallas/ragged_dot")
    e, h, i = 2, 128, 192  # I = 192: the gate/up boundary falls inside block 1
    x = jnp.ones((3, h), jnp.float32)
    ids, w = jnp.zeros((3, 1), jnp.int32), jnp.ones((3, 1), jnp.float32)
    gu = jnp.zeros((e, h, 2 * i), jnp.float8_e4m3fn)
    d = jnp.zeros((e, i, h), jnp.float8_e4m3fn)
    sgu, sd = jnp.ones((e, 1, 3), jnp.float32), jnp.ones((e, 2, 1), jnp.float32)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("expert", "tensor"))
    with pytest.raises(ValueError, match="w_gate_up_scale cannot follow a gate/up split at I=192"):
        rd.moe_experts(x, ids, w, gu, d, w_gate_up_scale=sgu, w_down_scale=sd, mesh=mesh, expert_axis="expert",
                       tensor_axis="tensor")
    with pytest.raises(ValueError, match=r"w_gate_up_scale must be a \(gate_scale, up_scale\) pair"):
        rd.moe_experts(x, ids, w, (gu[..., :i], gu[..., i:]), d, w_gate_up_scale=sgu, w_down_scale=sd)
