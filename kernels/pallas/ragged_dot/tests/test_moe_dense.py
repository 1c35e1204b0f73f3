"""moe_experts(formulation="dense"): every token through each routed local expert in one Pallas kernel (interpret
mode here) or in XLA. Checked against the float64 NumPy block (reference_moe_experts) on fresh random inputs: experts
nobody picks, one expert holding every row, ids outside the experts, token counts and widths off the tiles, a
gate-first array whose I is not a lane multiple, the (gate, up) pair, stacked layers, bf16 and f32, NaN carried;
its gradient against the sorted formulation's; the choice (plan_formulation) and its refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

E, H, INTER = 6, 48, 40  # widths not a multiple of 128


def _routing(kind: str, rng: np.random.Generator, t: int, k: int) -> np.ndarray:
    if kind == "empty_experts":  # experts 1 and 4 get no row
        return np.stack([rng.choice([0, 2, 3, 5], k, replace=False) for _ in range(t)]).astype(np.int32)
    if kind == "one_expert_all_rows":
        return np.full((t, k), 3, np.int32)
    if kind == "outside_ids":  # ids past the experts (padding tokens) contribute nothing
        ids = np.stack([rng.choice(E, k, replace=False) for _ in range(t)]).astype(np.int32)
        ids[::3, 0] = E + 2
        return ids
    return np.stack([rng.choice(E, k, replace=False) for _ in range(t)]).astype(np.int32)


def _inputs(kind: str, dtype: str, t: int, seed: int, inter: int = INTER, layers: int | None = None):
    rng = np.random.default_rng(seed)
    k = 1 if kind == "one_expert_all_rows" else 2
    dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    lead = () if layers is None else (layers,)
    x = jnp.asarray(rng.standard_normal((t, H), dtype=np.float32), dt)
    w = rng.random((t, k)).astype(np.float32)
    gu = jnp.asarray(rng.standard_normal((*lead, E, H, 2 * inter), dtype=np.float32) / np.sqrt(H), dt)
    down = jnp.asarray(rng.standard_normal((*lead, E, inter, H), dtype=np.float32) / np.sqrt(inter), dt)
    return x, _routing(kind, rng, t, k), jnp.asarray(w / w.sum(1, keepdims=True)), gu, down


def _kw(impl: str) -> dict:
    return {"implementation": impl, "interpret": True if impl == "pallas" else None, "formulation": "dense"}


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind,t", [("uniform", 13), ("empty_experts", 16), ("one_expert_all_rows", 5),
                                    ("outside_ids", 9)])
def test_dense_matches_float64(impl, dtype, kind, t):
    x, ids, w, gu, down = _inputs(kind, dtype, t, seed=hash((kind, dtype, t)) % 2**31)
    got = rd.moe_experts(x, ids, w, gu, down, **_kw(impl))
    ref = rd.reference_moe_experts(x, ids, w, gu, down)
    assert got.shape == (t, H) and got.dtype == x.dtype
    assert np.isfinite(np.asarray(got, np.float32)).all()
    assert rel_error(got, ref) < TOL[dtype]


@pytest.mark.parametrize("activation", ["silu", "gelu", "relu"])
def test_dense_activations_and_the_pair(activation):
    x, ids, w, gu, down = _inputs("uniform", "float32", 12, seed=7)
    pair = (gu[..., :INTER], gu[..., INTER:])
    ref = rd.reference_moe_experts(x, ids, w, gu, down, activation=activation)
    for weights in (gu, pair):
        got = rd.moe_experts(x, ids, w, weights, down, activation=activation, **_kw("pallas"))
        assert rel_error(got, ref) < TOL["float32"]


@pytest.mark.parametrize("inter", [128, 256, 200])
def test_dense_lane_multiple_and_ragged_intermediates(inter):
    """I a lane multiple (gate and up fetched as two blocks of one array) and not (the whole [H, 2I] block)."""
    x, ids, w, gu, down = _inputs("uniform", "bfloat16", 20, seed=inter, inter=inter)
    got = rd.moe_experts(x, ids, w, gu, down, **_kw("pallas"))
    assert rel_error(got, rd.reference_moe_experts(x, ids, w, gu, down)) < TOL["bfloat16"]


def test_dense_stacked_layers_in_a_scan():
    x, ids, w, gu, down = _inputs("empty_experts", "float32", 10, seed=3, layers=3)

    def body(carry, layer):
        return carry, rd.moe_experts(x, ids, w, gu, down, layer=layer, **_kw("pallas"))

    _, outs = jax.lax.scan(body, 0, jnp.arange(3))
    for layer in range(3):
        ref = rd.reference_moe_experts(x, ids, w, gu[layer], down[layer])
        assert rel_error(outs[layer], ref) < TOL["float32"]


def test_dense_f32_activations_over_bf16_weights():
    """Asked for with weights of another dtype than x, the kernel widens each weight tile to x's dtype."""
    x, ids, w, gu, down = _inputs("empty_experts", "float32", 11, seed=9)
    gu, down = gu.astype(jnp.bfloat16), down.astype(jnp.bfloat16)
    got = rd.moe_experts(x, ids, w, gu, down, **_kw("pallas"))
    assert got.dtype == jnp.float32
    assert rel_error(got, rd.reference_moe_experts(x, ids, w, gu, down)) < TOL["float32"]


def test_dense_nan_is_carried_to_its_token_only():
    x, ids, w, gu, down = _inputs("uniform", "float32", 8, seed=11)
    x = x.at[2, 5].set(jnp.nan)
    got = np.asarray(rd.moe_experts(x, ids, w, gu, down, **_kw("pallas")))
    assert np.isnan(got[2]).all()
    assert np.isfinite(np.delete(got, 2, axis=0)).all()


def _jnp_block(x, ids, w, gu, down):
    """The expert block in plain jnp at f32 HIGHEST precision, slot by slot (the gradient's reference)."""
    hi = jax.lax.Precision.HIGHEST
    out = jnp.zeros(x.shape, jnp.float32)
    for j in range(ids.shape[1]):
        e = jnp.asarray(ids[:, j])
        h = jnp.einsum("th,thi->ti", x, gu[e], precision=hi)
        a = jax.nn.silu(h[:, :INTER]) * h[:, INTER:]
        out = out + w[:, j:j + 1] * jnp.einsum("ti,tih->th", a, down[e], precision=hi)
    return out


def test_dense_gradient_matches_a_plain_jnp_block():
    """Forward in the dense kernel, gradient by the sorted formulation's kernels: both against plain jnp."""
    x, ids, w, gu, down = _inputs("empty_experts", "float32", 9, seed=5)
    loss = lambda f: (lambda *a: jnp.sum(jnp.sin(f(*a))))
    dense = lambda x, w, gu, down: rd.moe_experts(x, ids, w, gu, down, **_kw("pallas"))
    got = jax.grad(loss(dense), argnums=(0, 1, 2, 3))(x, w, gu, down)
    want = jax.grad(loss(lambda x, w, gu, down: _jnp_block(x, ids, w, gu, down)), argnums=(0, 1, 2, 3))(x, w, gu, down)
    for g, r in zip(got, want, strict=True):
        assert np.isfinite(np.asarray(g)).all()
        assert rel_error(g, np.asarray(r, np.float64)) < 1e-4
    assert not np.asarray(got[2])[[1, 4]].any()  # experts nobody picked get no weight gradient


def test_the_choice_and_its_reasons():
    chips = rd.moe.experts.chip_for_device_kind
    v6e, v5e = chips("TPU v6 lite"), chips("TPU v5 lite")
    form, ti, _, why = rd.plan_formulation(64, 2048, 768, chip=v6e)
    assert (form, ti) == ("dense", 768) and "256 MXU rows" in why
    form, _, _, why = rd.plan_formulation(4096, 2048, 768, chip=v6e)
    assert form == "sorted" and "exceed" in why
    assert rd.plan_formulation(200, 2048, 768, chip=v6e)[0] == "dense"
    assert rd.plan_formulation(200, 2048, 768, chip=v5e)[0] == "sorted"  # 208 rows past v5e's 128
    assert rd.plan_formulation(64, 2048, 768, chip=None)[0] == "sorted"  # off a known TPU
    assert rd.plan_formulation(64, 2048, 768, chip=v6e, quantized=True)[0] == "sorted"
    form, _, _, why = rd.plan_formulation(64, 2048, 768, chip=v6e, itemsize=4, mixed_dtypes=True)
    assert form == "sorted" and "dtype" in why
    assert rd.plan_formulation(64, 2048, 768, chip=v6e, mixed_dtypes=True, formulation="dense")[0] == "dense"
    form, _, _, why = rd.plan_formulation(64, 2048, 768, chip=v6e, activation="gelu_exact")
    assert form == "sorted" and "erf" in why
    with pytest.raises(ValueError, match="gelu_exact"):
        rd.plan_formulation(64, 2048, 768, chip=v6e, activation="gelu_exact", formulation="dense")
    assert rd.plan_formulation(64, 2048, 768, chip=v6e, scheme="all_to_all")[0] == "sorted"
    # Gemma 4's I (704) is not a lane multiple: the whole expert per step
    assert rd.plan_formulation(64, 2816, 704, chip=v6e)[:2] == ("dense", 704)
    with pytest.raises(ValueError, match="quantized"):
        rd.plan_formulation(64, 2048, 768, chip=v6e, quantized=True, formulation="dense")
    with pytest.raises(ValueError, match="unknown formulation"):
        rd.plan_formulation(64, 2048, 768, chip=v6e, formulation="fused")


def test_the_dense_path_is_one_kernel_with_no_sort_of_rows():
    x, ids, w, gu, down = _inputs("uniform", "bfloat16", 16, seed=4)
    text = str(jax.make_jaxpr(lambda *a: rd.moe_experts(*a, **_kw("pallas")))(x, ids, w, gu, down))
    assert text.count("pallas_call") == 1
    sorted_text = str(jax.make_jaxpr(lambda *a: rd.moe_experts(*a, implementation="pallas", interpret=True,
                                                               formulation="sorted"))(x, ids, w, gu, down))
    assert sorted_text.count("pallas_call") == 2


def test_cpu_default_stays_sorted_and_equal():
    x, ids, w, gu, down = _inputs("uniform", "float32", 7, seed=2)
    sorted_out = rd.moe_experts(x, ids, w, gu, down)
    dense_out = rd.moe_experts(x, ids, w, gu, down, formulation="dense")
    np.testing.assert_allclose(np.asarray(sorted_out), np.asarray(dense_out), rtol=2e-5, atol=2e-5)
