"""Ragged paged attention on caches stacked over layers (`layer=`): the stacked call gives exactly the numbers of the
one-layer call on cache[layer] and leaves every other layer bit-identical, checked against the float64 reference on
fresh random inputs, with the layer concrete or traced inside a lax.scan over the layers, for every implementation;
bad layers and ranks are one clear ValueError."""

from __future__ import annotations

import flash_attention as fa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flash_attention.paged_cases import SMALL, PagedScenario, features, flat, paged_inputs

from kernel_hub.verify.numerics import relative_error, tolerance

ARGS = ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")
LAYERS = 3

#: decode: one new token per sequence (the decode schedule), GQA; mixed: SMALL's prefill + decode with a sliding
#: window, an empty sequence, an empty slot and padding rows.
DECODE = PagedScenario("decode_gqa", ((1, 16), (1, 17), (1, 1), (1, 40)), hq=4, hkv=2, d=128, page_size=16,
                       pages_per_seq=3)
MIXED = next(sc for sc in SMALL if sc.name == "mixed_gqa_window")


def _stacked(sc: PagedScenario, dtype: str, seed: int) -> tuple[dict, jax.Array, jax.Array]:
    """One problem's inputs and two [LAYERS, ...] stacks of fresh random caches (every layer different)."""
    x = paged_inputs(sc, dtype, seed)
    rng = np.random.default_rng(seed + 1000)
    shape = (LAYERS, *x["k_cache"].shape)
    ks, vs = (jnp.asarray(rng.standard_normal(shape).astype(np.float32), dtype) for _ in range(2))
    return x, ks, vs


def _args(x: dict, k_cache, v_cache) -> list:
    return [*(x[k] for k in ARGS[:3]), k_cache, v_cache, *(x[k] for k in ARGS[5:])]


def _same(a, b) -> bool:
    return np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), equal_nan=False)


def _check_layer_call(sc, x, ks, vs, layer: int, got, *, impl: str, dtype: str, **kw) -> None:
    """`got` (out, k stack, v stack) of the stacked call at `layer`: within tolerance of the float64 reference on
    that layer's caches, exactly the one-layer call's numbers, every other layer untouched."""
    out, k2, v2 = got
    assert k2.shape == ks.shape and v2.shape == vs.shape and k2.dtype == ks.dtype
    assert np.isfinite(np.asarray(out, np.float32)).all()
    ref = fa.reference_ragged_paged_attention(*_args(x, ks[layer], vs[layer]), sinks=x["sinks"], **features(sc))
    err = relative_error(flat(out, k2[layer], v2[layer]), flat(*ref))
    assert err <= tolerance(dtype), f"{sc.name} {impl} {dtype} layer {layer}: {err}"
    one = fa.ragged_paged_attention(*_args(x, ks[layer], vs[layer]), sinks=x["sinks"], implementation=impl,
                                    **features(sc), **kw)
    for a, b in zip(one, (out, k2[layer], v2[layer]), strict=True):
        assert _same(a, b), f"{sc.name} {impl}: the stacked call differs from the one-layer call"
    for other in range(LAYERS):
        if other != layer:
            assert _same(k2[other], ks[other]) and _same(v2[other], vs[other]), f"layer {other} was touched"


@pytest.mark.parametrize(("impl", "sc", "dtype", "layer"), [
    ("cpu", DECODE, "float32", 1),
    ("cpu", MIXED, "bfloat16", 2),
    ("xla", MIXED, "float32", 0),
    ("xla", DECODE, "bfloat16", 2),
    ("pallas", DECODE, "bfloat16", 2),
    ("pallas", MIXED, "float32", 1),
], ids=lambda v: getattr(v, "name", str(v)))
def test_stacked_call_matches_reference_and_the_one_layer_call(impl, sc, dtype, layer) -> None:
    x, ks, vs = _stacked(sc, dtype, seed=5 + layer)
    got = fa.ragged_paged_attention(*_args(x, ks, vs), layer=layer, sinks=x["sinks"], implementation=impl,
                                    **features(sc))
    assert fa.last_implementation()[0] == impl
    _check_layer_call(sc, x, ks, vs, layer, got, impl=impl, dtype=dtype)


def test_sliding_window_on_a_stack_matches_reference() -> None:
    sc = PagedScenario("window_decode_prefill", ((1, 45), (6, 30)), hq=4, hkv=1, d=128, page_size=16,
                       pages_per_seq=3, window=10, soft_cap=5.0, sinks=True)
    x, ks, vs = _stacked(sc, "float32", seed=21)
    got = fa.ragged_paged_attention(*_args(x, ks, vs), layer=np.int32(1), sinks=x["sinks"], implementation="cpu",
                                    **features(sc))
    _check_layer_call(sc, x, ks, vs, 1, got, impl="cpu", dtype="float32")


@pytest.mark.parametrize(("impl", "dtype"), [("cpu", "float32"), ("xla", "bfloat16"), ("pallas", "bfloat16")])
def test_traced_layer_inside_a_scan_over_layers(impl: str, dtype: str) -> None:
    """A decode step's shape: the stacks in the carry, each layer its own queries and new K/V, the layer the scan's
    counter; each layer's output and cache as the one-layer call on it, every layer written once."""
    sc = DECODE if impl == "pallas" else MIXED
    x, ks, vs = _stacked(sc, dtype, seed=31)
    rng = np.random.default_rng(32)
    per_layer = {k: jnp.asarray(rng.standard_normal((LAYERS, *x[k].shape)).astype(np.float32), dtype)
                 for k in ARGS[:3]}

    def step(k_stack, v_stack, q, k, v):
        def body(carry, xs):
            i, q_i, k_i, v_i = xs
            out, k_s, v_s = fa.ragged_paged_attention(q_i, k_i, v_i, *carry, *(x[n] for n in ARGS[5:]), layer=i,
                                                      sinks=x["sinks"], implementation=impl, **features(sc))
            return (k_s, v_s), out

        (k_stack, v_stack), outs = jax.lax.scan(body, (k_stack, v_stack), (jnp.arange(LAYERS), q, k, v))
        return outs, k_stack, v_stack

    outs, k2, v2 = jax.jit(step)(ks, vs, *(per_layer[k] for k in ARGS[:3]))
    assert outs.shape == (LAYERS, *x["queries"].shape)
    for i in range(LAYERS):
        xi = dict(x, **{k: per_layer[k][i] for k in ARGS[:3]})
        one = fa.ragged_paged_attention(*_args(xi, ks[i], vs[i]), sinks=x["sinks"], implementation=impl,
                                        **features(sc))
        for a, b in zip(one, (outs[i], k2[i], v2[i]), strict=True):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=0, atol=0,
                                       err_msg=f"{impl} layer {i}")
        ref = fa.reference_ragged_paged_attention(*_args(xi, ks[i], vs[i]), sinks=x["sinks"], **features(sc))
        assert relative_error(flat(outs[i], k2[i], v2[i]), flat(*ref)) <= tolerance(dtype)
        assert not _same(k2[i], ks[i])  # this layer's new rows were written


@pytest.mark.parametrize("impl", ["cpu", "pallas"])
def test_fp8_stacked_caches(impl: str) -> None:
    """float8_e4m3fn stacks with per-cache scales: the rows quantized on store into the right layer, the numbers
    those of the one-layer fp8 call, other layers' bytes untouched."""
    sc = PagedScenario("decode_gqa_fp8", ((1, 33), (1, 64), (1, 1)), hq=4, hkv=2, d=128, page_size=32,
                       pages_per_seq=2)  # fp8 pages fill whole sublane tiles at 32 rows
    x, ks, vs = _stacked(sc, "bfloat16", seed=41)
    ks, vs = ks.astype(jnp.float8_e4m3fn), vs.astype(jnp.float8_e4m3fn)
    scales = {"k_scale": 0.5, "v_scale": 0.25}
    out, k2, v2 = fa.ragged_paged_attention(*_args(x, ks, vs), layer=0, sinks=x["sinks"], implementation=impl,
                                            **features(sc), **scales)
    assert k2.dtype == jnp.float8_e4m3fn
    one = fa.ragged_paged_attention(*_args(x, ks[0], vs[0]), sinks=x["sinks"], implementation=impl, **features(sc),
                                    **scales)
    for a, b in zip(one, (out, k2[0], v2[0]), strict=True):
        assert _same(a, b)
    assert np.isfinite(np.asarray(out, np.float32)).all()
    ref = fa.reference_ragged_paged_attention(*_args(x, ks[0], vs[0]), sinks=x["sinks"], **features(sc), **scales)
    assert relative_error(np.asarray(out, np.float64).ravel(), ref[0].ravel()) <= tolerance("bfloat16")
    for other in (1, 2):
        assert np.array_equal(np.asarray(k2[other]).view(np.uint8), np.asarray(ks[other]).view(np.uint8))
        assert np.array_equal(np.asarray(v2[other]).view(np.uint8), np.asarray(vs[other]).view(np.uint8))


def test_no_tokens_returns_the_stacks_unchanged() -> None:
    x, ks, vs = _stacked(DECODE, "float32", seed=51)
    empty = dict(x, queries=x["queries"][:0], keys=x["keys"][:0], values=x["values"][:0],
                 cu_q_lens=np.zeros_like(x["cu_q_lens"]), kv_lens=np.zeros_like(x["kv_lens"]))
    out, k2, v2 = fa.ragged_paged_attention(*_args(empty, ks, vs), layer=1, implementation="cpu")
    assert out.shape == (0, DECODE.hq, DECODE.d)
    assert _same(k2, ks) and _same(v2, vs)


def test_a_traced_layer_past_the_stack_is_clamped_into_it() -> None:
    """Like traced page ids: nothing is read or written outside the stack (the last layer takes the rows)."""
    x, ks, vs = _stacked(DECODE, "float32", seed=61)
    call = jax.jit(lambda layer: fa.ragged_paged_attention(*_args(x, ks, vs), layer=layer, implementation="cpu"))
    past, last = call(jnp.int32(LAYERS + 4)), call(jnp.int32(LAYERS - 1))
    for a, b in zip(past, last, strict=True):
        assert _same(a, b)
    assert _same(past[1][0], ks[0]) and not _same(past[1][LAYERS - 1], ks[LAYERS - 1])


@pytest.mark.parametrize(("layer", "stacked", "match"), [
    (3, True, r"layer must be in \[0, 3\).*got 3"),
    (-1, True, r"layer must be in \[0, 3\).*got -1"),
    (1.0, True, "layer must be an integer scalar"),
    (True, True, "layer must be an integer scalar"),
    (np.array([1], np.int32), True, r"layer must be an integer scalar.*int32\[1\]"),
    ("1", True, "layer must be an integer scalar"),
    (0, False, r"with layer=, k_cache and v_cache must both be stacked over layers, \[layers, num_pages"),
    (None, True, r"must both be \[num_pages, page_size, kv_heads, head_dim\].*take layer="),
])
def test_bad_layer_or_rank_is_one_clear_error(layer, stacked: bool, match: str) -> None:
    x, ks, vs = _stacked(DECODE, "float32", seed=71)
    caches = (ks, vs) if stacked else (ks[0], vs[0])
    with pytest.raises(ValueError, match=match):
        fa.ragged_paged_attention(*_args(x, *caches), layer=layer, implementation="cpu")


def test_stacks_of_different_shapes_are_refused() -> None:
    x, ks, vs = _stacked(DECODE, "float32", seed=81)
    with pytest.raises(ValueError, match="must both be stacked over layers"):
        fa.ragged_paged_attention(*_args(x, ks, vs[:2]), layer=0, implementation="cpu")
    with pytest.raises(ValueError, match="one dtype"):
        fa.ragged_paged_attention(*_args(x, ks, vs.astype(jnp.bfloat16)), layer=0, implementation="cpu")
