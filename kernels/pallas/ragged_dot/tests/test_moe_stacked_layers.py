"""moe_experts(layer=) on expert weights stacked over layers ([L, E, ...]): every implementation equals the float64
NumPy block (reference_moe_experts) on w[layer] and the unstacked call on w[layer], for the first and the last layer,
a traced layer in a scan included, with experts that get no row and one expert holding every row; the Pallas path
never slices the stacks; bad stacked input gets one clear error. (The expert-parallel mesh case runs on 8 simulated
devices in tests/moe_mesh_worker.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

LAYERS, T, H, INTER, E = 3, 11, 48, 40, 6  # widths not a multiple of the kernel's tiles


def _routing(kind: str, rng: np.random.Generator, k: int) -> np.ndarray:
    if kind == "empty_experts":  # experts 1 and 4 get no row
        return np.stack([rng.choice([0, 2, 3, 5], k, replace=False) for _ in range(T)]).astype(np.int32)
    return np.full((T, k), 3, np.int32)  # "one_expert_all_rows": every row in expert 3's group (k = 1)


def _inputs(kind: str, dtype: str, seed: int):
    rng = np.random.default_rng(seed)
    k = 1 if kind == "one_expert_all_rows" else 2
    dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    x = jnp.asarray(rng.standard_normal((T, H), dtype=np.float32), dt)
    w = rng.random((T, k)).astype(np.float32)
    gu = jnp.asarray(rng.standard_normal((LAYERS, E, H, 2 * INTER), dtype=np.float32) / np.sqrt(H), dt)
    down = jnp.asarray(rng.standard_normal((LAYERS, E, INTER, H), dtype=np.float32) / np.sqrt(INTER), dt)
    return x, _routing(kind, rng, k), jnp.asarray(w / w.sum(1, keepdims=True)), gu, down


def _kw(impl: str) -> dict:
    return {"implementation": impl, "interpret": True if impl == "pallas" else None}


@pytest.mark.parametrize("layer", [0, LAYERS - 1])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["empty_experts", "one_expert_all_rows"])
@pytest.mark.parametrize("impl", ["cpu", "xla", "pallas"])
def test_stacked_matches_reference_and_unstacked_call(impl, kind, dtype, layer):
    x, ids, w, gu, down = _inputs(kind, dtype, seed=11 * layer + len(kind))
    out = rd.moe_experts(x, ids, w, gu, down, layer=layer, activation="gelu", **_kw(impl))
    assert out.shape == (T, H) and out.dtype == x.dtype
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    ref = rd.reference_moe_experts(x, ids, w, gu[layer], down[layer], "gelu")
    other = rd.reference_moe_experts(x, ids, w, gu[(layer + 1) % LAYERS], down[(layer + 1) % LAYERS], "gelu")
    assert rel_error(out, ref) <= TOL[dtype]
    assert rel_error(out, other) > TOL[dtype]  # that layer, not another one
    unstacked = rd.moe_experts(x, ids, w, gu[layer], down[layer], activation="gelu", **_kw(impl))
    assert rel_error(out, unstacked) <= TOL[dtype]


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_traced_layer_in_a_scan(impl):
    """A model's layers as a scan over a counter, the stacks closed over whole."""
    x, ids, w, gu, down = _inputs("empty_experts", "float32", seed=5)

    @jax.jit
    def all_layers(x, gu, down):
        def body(_, layer):
            return None, rd.moe_experts(x, ids, w, gu, down, layer=layer, **_kw(impl))
        return jax.lax.scan(body, None, jnp.arange(LAYERS, dtype=jnp.int32))[1]

    outs = all_layers(x, gu, down)
    for layer in range(LAYERS):
        assert rel_error(outs[layer], rd.reference_moe_experts(x, ids, w, gu[layer], down[layer])) <= TOL["float32"]


def test_gate_up_pair_stacked():
    x, ids, w, gu, down = _inputs("empty_experts", "float32", seed=8)
    pair = (gu[..., :INTER], gu[..., INTER:])
    out = rd.moe_experts(x, ids, w, pair, down, layer=jnp.int32(1), **_kw("pallas"))
    assert rel_error(out, rd.reference_moe_experts(x, ids, w, gu[1], down[1])) <= TOL["float32"]


def test_pallas_never_slices_the_stacks():
    x, ids, w, gu, down = _inputs("empty_experts", "bfloat16", seed=2)
    text = str(jax.make_jaxpr(lambda a, b, i: rd.moe_experts(x, ids, w, a, b, layer=i, **_kw("pallas")))(
        gu, down, jnp.int32(1)))
    assert text.count("pallas_call") == 2
    stacks = (f"bf16[{LAYERS},{E},{H},{2 * INTER}]", f"bf16[{LAYERS},{E},{INTER},{H}]")
    for line in text.splitlines():  # no op takes a stack apart
        if any(s in line for s in stacks) and any(op in line for op in ("dynamic_slice", "gather", "slice[")):
            pytest.fail(f"a stack is sliced: {line.strip()}")


def test_partition_specs_stacked():
    from jax.sharding import PartitionSpec as P

    specs, _ = rd.partition_specs("expert", None, "psum", stacked=True)
    assert specs[3] == P(None, "expert", None, None) and specs[4] == P(None, "expert", None, None)
    specs, _ = rd.partition_specs("expert", "tensor", "psum", stacked=True)
    assert specs[3] == (P(None, "expert", None, "tensor"),) * 2 and specs[4] == P(None, "expert", "tensor", None)


@pytest.mark.parametrize("bad", ["quantized", "float_layer", "out_of_range", "unstacked", "layers_differ",
                                 "fused_gate_up_with_tensor_axis"])
def test_bad_stacked_input_names_what_to_fix(bad):
    x, ids, w, gu, down = _inputs("empty_experts", "float32", seed=3)
    kw: dict = {"layer": 1, "implementation": "xla"}
    if bad == "quantized":
        kw["w_down_scale"] = jnp.ones((LAYERS, E, 1, H), jnp.float32)
    elif bad == "float_layer":
        kw["layer"] = 1.0
    elif bad == "out_of_range":
        kw["layer"] = LAYERS
    elif bad == "unstacked":
        gu, down = gu[0], down[0]
    elif bad == "layers_differ":
        down = down[:2]
    else:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("expert", "tensor"))
        kw |= {"mesh": mesh, "expert_axis": "expert", "tensor_axis": "tensor"}
    with pytest.raises(ValueError, match="layer"):
        rd.moe_experts(x, ids, w, gu, down, **kw)
