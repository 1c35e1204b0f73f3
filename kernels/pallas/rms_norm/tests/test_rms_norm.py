"""The RMSNorm kernels (interpreted Pallas, the XLA path, the torch-native path) against the NumPy float64
reference, forward and gradients, on the edges: rows not a multiple of the row tile, hidden sizes not a multiple of
128, one row, leading axes, both forms and cast orders, bf16 and f32; NaN rows stay NaN and stay in their row."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rms_norm as rn

from kernel_hub.verify.numerics import relative_error, tolerance

TILES = rn.RMSNormConfig(block_rows=16)
#: (implementation, shape, zero_centered): rows past the 16-row tile, hidden not a multiple of 128, leading axes, one
#: row, an exact tile; both forms on both paths (interpreted Pallas costs seconds a shape, so each edge once).
CASES = [("pallas", (37, 256), False), ("pallas", (40, 200), True), ("pallas", (2, 9, 384), False),
         ("xla", (37, 256), True), ("xla", (1, 2112), False), ("xla", (16, 128), True)]


def _inputs(shape, dtype, seed, zero_centered=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * 2.0
    w = (rng.standard_normal(shape[-1]) * 0.5 + (0.0 if zero_centered else 1.0)).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    cast = lambda a: jnp.asarray(a, dtype)
    return cast(x), cast(w), cast(dy)


def _f64(a):
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


@pytest.mark.parametrize(("impl", "shape", "zero_centered"), CASES, ids=[f"{i}-{s}-{z}" for i, s, z in CASES])
def test_forward_and_gradients_match_float64_reference(impl, shape, zero_centered):
    dtype = "bfloat16" if (len(shape) + zero_centered) % 2 else "float32"
    x, w, dy = _inputs(shape, dtype, seed=shape[-1], zero_centered=zero_centered)
    kw = dict(eps=1e-6, zero_centered=zero_centered, implementation=impl, config=TILES)
    y = rn.rms_norm(x, w, **kw)
    assert y.shape == x.shape and y.dtype == x.dtype
    ref = rn.reference_rms_norm(_f64(x), _f64(w), eps=1e-6, zero_centered=zero_centered)
    assert relative_error(np.asarray(y, np.float32), ref) <= tolerance(dtype)
    loss = lambda a, b: jnp.sum(rn.rms_norm(a, b, **kw).astype(jnp.float32) * dy.astype(jnp.float32))
    dx, dw = jax.grad(loss, argnums=(0, 1))(x, w)
    assert dx.dtype == x.dtype and dw.dtype == w.dtype and dw.shape == w.shape
    rdx, rdw = rn.reference_rms_norm_grads(_f64(x), _f64(w), _f64(dy), eps=1e-6, zero_centered=zero_centered)
    assert relative_error(np.asarray(dx, np.float32), rdx) <= 3 * tolerance(dtype)
    assert relative_error(np.asarray(dw, np.float32), rdw) <= 3 * tolerance(dtype)


def test_hand_written_backward_matches_jax_autodiff():
    x, w, dy = _inputs((20, 136), "float32", seed=1)
    grads = {}
    for impl in ("pallas", "xla", "autodiff"):
        loss = lambda a, b, impl=impl: jnp.sum(rn.rms_norm(a, b, eps=1e-5, implementation=impl, config=TILES) * dy)
        grads[impl] = jax.grad(loss, argnums=(0, 1))(x, w)
    for impl in ("pallas", "xla"):
        for ours, theirs in zip(grads[impl], grads["autodiff"], strict=True):
            assert relative_error(ours, theirs) <= 1e-5


def test_llama_cast_order_rounds_before_scaling():
    """scale_after_cast (Llama's order) in bf16 equals rounding x_normed to bf16, then one bf16 multiply."""
    x, w, _ = _inputs((33, 256), "bfloat16", seed=2)
    for impl in ("pallas", "xla"):
        y = rn.rms_norm(x, w, eps=1e-6, scale_after_cast=True, implementation=impl, config=TILES)
        xf = x.astype(jnp.float32)
        n = (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(jnp.bfloat16)
        expected = n * w  # bf16 x bf16 -> bf16, one rounding
        assert relative_error(np.asarray(y, np.float32), np.asarray(expected, np.float32)) <= 2 ** -8
    # and it differs from the Gemma order (scale in f32, one cast) somewhere: the flag does something
    other = rn.rms_norm(x, w, eps=1e-6, implementation="xla")
    assert not np.array_equal(np.asarray(y, np.float32), np.asarray(other, np.float32))


@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_nan_stays_in_its_row_forward_and_backward(impl):
    x, w, dy = _inputs((40, 200), "float32", seed=3)
    x = x.at[17, 5].set(jnp.nan)  # row 17 sits in the second 16-row tile
    kw = dict(eps=1e-6, implementation=impl, config=TILES)
    y = np.asarray(rn.rms_norm(x, w, **kw))
    assert np.isnan(y[17]).all() and np.isfinite(np.delete(y, 17, axis=0)).all()
    dx, dw = jax.grad(lambda a, b: jnp.sum(rn.rms_norm(a, b, **kw) * dy), argnums=(0, 1))(x, w)
    dx = np.asarray(dx)
    assert np.isnan(dx[17]).all() and np.isfinite(np.delete(dx, 17, axis=0)).all()
    assert np.isnan(np.asarray(dw)).any()  # a NaN row poisons the weight's gradient, never silently dropped


def test_partial_last_tile_rows_do_not_leak_into_the_weight_gradient():
    """37 rows in 16-row tiles: the last tile's 11 rows past the end hold garbage; dw must not see them."""
    x, w, dy = _inputs((37, 128), "float32", seed=4)
    loss = lambda a, b: jnp.sum(rn.rms_norm(a, b, eps=1e-6, implementation="pallas", config=TILES) * dy)
    _, dw = jax.grad(loss, argnums=(0, 1))(x, w)
    _, rdw = rn.reference_rms_norm_grads(_f64(x), _f64(w), _f64(dy), eps=1e-6)
    assert relative_error(dw, rdw) <= 1e-5


def test_empty_input_and_bad_operands():
    out = rn.rms_norm(jnp.zeros((0, 64)), jnp.ones(64), eps=1e-6)
    assert out.shape == (0, 64)
    with pytest.raises(ValueError, match=r"weight must have shape \(64,\)"):
        rn.rms_norm(jnp.zeros((3, 64)), jnp.ones(63), eps=1e-6)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        rn.rms_norm(jnp.zeros((3, 64)), jnp.ones(64), eps=-1.0)
    with pytest.raises(ValueError, match="block_rows"):
        rn.RMSNormConfig(block_rows=12)


def test_default_tiles_fit_the_budget_and_cover_small_inputs():
    from rms_norm.config import block_rows

    assert block_rows(64, 2048, rn.RMSNormConfig()) == 64  # decode: one tile of all rows
    assert block_rows(4096, 2048, rn.RMSNormConfig()) == 128  # 128 x 2048 x 4 B = 1 MiB
    assert block_rows(4096, 2880, rn.RMSNormConfig()) % 16 == 0
    assert block_rows(5, 4096, rn.RMSNormConfig()) == 5


def test_race_free_on_the_tpu_simulator():
    x, w, dy = _inputs((20, 128), "float32", seed=5)  # two 16-row steps, the second partial
    params = rn.race_checking_params(seed=0)
    fn = lambda a, b: jax.grad(lambda a, b: jnp.sum(
        rn.rms_norm(a, b, eps=1e-6, implementation="pallas", interpret=params, config=TILES) * dy),
        argnums=(0, 1))(a, b)
    dx, dw = rn.run_race_checked(fn, x, w)
    rdx, rdw = rn.reference_rms_norm_grads(_f64(x), _f64(w), _f64(dy), eps=1e-6)
    assert relative_error(dx, rdx) <= 1e-4 and relative_error(dw, rdw) <= 1e-4


def test_torch_entry_and_layers_match_the_reference():
    torch = pytest.importorskip("torch")
    import importlib

    import kernel_hub as kh

    tm = kh.get_local_kernel(_source(), framework="torch", backend="cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 200, generator=g).to(torch.bfloat16)
    w = (torch.randn(200, generator=g) * 0.5 + 1).to(torch.bfloat16)
    for impl in ("torch", "jax"):
        y = tm.rms_norm(x, w, eps=1e-6, scale_after_cast=True, implementation=impl)
        assert y.dtype == torch.bfloat16
        ref = rn.reference_rms_norm(x.float().numpy(), w.float().numpy(), eps=1e-6)
        assert relative_error(y, ref) <= tolerance("bfloat16")
    layers = importlib.import_module(f"{tm.__name__}.layers")
    norm = torch.nn.Module()
    norm.weight = torch.nn.Parameter(w)
    norm.variance_epsilon = 1e-6
    out = layers.RMSNorm.forward(norm, x)
    expected = w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(out, expected)  # Llama's order, bit for bit
    assert tm.last_implementation()[0] == "torch"


def _source():
    from pathlib import Path

    return Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize(("layers", "at"), [(5, 3), (20, 18)])  # one block of the stack; the second, partial one
def test_layer_reads_its_row_of_a_stacked_weight(impl, layers, at):
    x, _, dy = _inputs((37, 256), "bfloat16", seed=layers)
    stack = jnp.asarray(np.random.default_rng(at).standard_normal((layers, 256)).astype(np.float32) + 1.0,
                        jnp.bfloat16)
    kw = dict(eps=1e-6, implementation=impl, config=TILES)
    got = rn.rms_norm(x, stack, layer=at, **kw)
    ref = rn.reference_rms_norm(_f64(x), _f64(stack[at]), eps=1e-6)
    assert relative_error(np.asarray(got, np.float32), ref) <= tolerance("bfloat16")
    np.testing.assert_array_equal(np.asarray(got, np.float32),
                                  np.asarray(rn.rms_norm(x, stack[at], **kw), np.float32))
    # traced (a scan's counter): the same row; one past the end is clamped to the last
    traced = jax.jit(lambda a, s, i: rn.rms_norm(a, s, layer=i, **kw))
    np.testing.assert_array_equal(np.asarray(traced(x, stack, jnp.int32(at))), np.asarray(got))
    np.testing.assert_array_equal(np.asarray(traced(x, stack, jnp.int32(layers + 3))),
                                  np.asarray(rn.rms_norm(x, stack[layers - 1], **kw)))
    # the stack's gradient is the row's, zeros elsewhere
    loss = lambda s: jnp.sum(rn.rms_norm(x, s, layer=at, **kw).astype(jnp.float32) * dy.astype(jnp.float32))
    d_stack = jax.grad(loss)(stack)
    d_row = jax.grad(lambda w: jnp.sum(rn.rms_norm(x, w, **kw).astype(jnp.float32) * dy.astype(jnp.float32)))(
        stack[at])
    assert d_stack.shape == stack.shape and float(jnp.max(jnp.abs(jnp.delete(d_stack, at, axis=0)))) == 0.0
    np.testing.assert_array_equal(np.asarray(d_stack[at], np.float32), np.asarray(d_row, np.float32))


@pytest.mark.parametrize(("weight", "layer", "match"), [
    ((4, 256), 4, r"layer must be in \[0, 4\)"), ((4, 256), 1.0, "integer scalar"), ((256,), 0, "stacked over layers"),
    ((4, 128), 0, r"weight must have shape \(256,\)")])
def test_a_bad_layer_or_stack_is_refused(weight, layer, match):
    with pytest.raises(ValueError, match=match):
        rn.rms_norm(jnp.ones((3, 256)), jnp.ones(weight), eps=1e-6, layer=layer)


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize(("dtype", "layers"), [("bfloat16", None), ("float32", 20)])
def test_residual_is_added_first_and_returned(impl, dtype, layers):
    """rms_norm(x, w, residual=r) -> (norm(x + r), x + r), the sum rounded to x's dtype before the norm reads it
    (as transformers' residual stream is); with layer= on a stack as well; gradients reach x, r and the weight."""
    x, w, dy = _inputs((37, 256), dtype, seed=11)
    r = jnp.asarray(np.random.default_rng(12).standard_normal((37, 256)).astype(np.float32) * 3.0, dtype)
    stack = None if layers is None else jnp.asarray(
        np.random.default_rng(13).standard_normal((layers, 256)).astype(np.float32) + 1.0, dtype)
    weight, kw = (w, {}) if layers is None else (stack, {"layer": 17})
    row = w if layers is None else stack[17]
    y, total = rn.rms_norm(x, weight, eps=1e-6, residual=r, implementation=impl, config=TILES, **kw)
    want_total = np.asarray((x.astype(jnp.float32) + r.astype(jnp.float32)).astype(dtype), np.float32)
    np.testing.assert_array_equal(np.asarray(total, np.float32), want_total)
    ref = rn.reference_rms_norm(want_total.astype(np.float64), _f64(row), eps=1e-6)
    assert y.dtype == total.dtype == x.dtype
    assert relative_error(np.asarray(y, np.float32), ref) <= tolerance(dtype)
    plain = rn.rms_norm(total, row, eps=1e-6, implementation=impl, config=TILES)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(plain, np.float32))

    def loss(a, b, c):
        out, s = rn.rms_norm(a, c, eps=1e-6, residual=b, implementation=impl, config=TILES, **kw)
        return jnp.sum(out.astype(jnp.float32) * dy.astype(jnp.float32)) + jnp.sum(s.astype(jnp.float32))
    dx, dr, dw = jax.grad(loss, argnums=(0, 1, 2))(x, r, weight)
    assert np.all(np.isfinite(np.asarray(dx, np.float32))) and float(jnp.max(jnp.abs(dw.astype(jnp.float32)))) > 0
    np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(dr, np.float32))  # d/dx = d/dr
    with pytest.raises(ValueError, match="residual must have"):
        rn.rms_norm(x, weight, eps=1e-6, residual=r[:3], **kw)


@pytest.mark.parametrize("impl", ["pallas", "xla"])
@pytest.mark.parametrize(("dtype", "layers"), [("bfloat16", None), ("float32", 20)])
def test_sandwich_x_weight_normalises_x_before_the_add(impl, dtype, layers):
    """rms_norm(x, w, residual=r, x_weight=wx) -> (norm_w(norm_wx(x) + r), norm_wx(x) + r): a sandwich norm's
    post-norm, the add and the next norm in one call; against the float64 reference (the post-norm's output and
    the sum rounded to the dtype as separate ops store them), equal to the two calls it replaces, gradients reach
    every input."""
    rng = np.random.default_rng(21)
    arr = lambda shape, scale=1.0, shift=0.0: jnp.asarray(rng.standard_normal(shape).astype(np.float32) * scale
                                                          + shift, dtype)
    x, r, dy = arr((37, 256), 3.0), arr((37, 256)), arr((37, 256))
    lead = () if layers is None else (layers,)
    w, wx = arr((*lead, 256), 0.3, 1.0), arr((*lead, 256), 0.3, 1.0)
    kw = {} if layers is None else {"layer": 17}
    row = (lambda a: a) if layers is None else (lambda a: a[17])
    y, total = rn.rms_norm(x, w, eps=1e-6, residual=r, x_weight=wx, implementation=impl, config=TILES, **kw)
    post = rn.rms_norm(x, row(wx), eps=1e-6, implementation=impl, config=TILES)
    y2, total2 = rn.rms_norm(post, row(w), eps=1e-6, residual=r, implementation=impl, config=TILES)
    for got, want in ((total, total2), (y, y2)):  # XLA may fuse the f32 reductions in another order: an ulp
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-6, atol=1e-6)
    rounded = lambda a: np.asarray(jnp.asarray(a, dtype).astype(jnp.float32), np.float64)
    want_total = rounded(rounded(rn.reference_rms_norm(_f64(x), _f64(row(wx)), eps=1e-6)) + _f64(r))
    assert relative_error(np.asarray(total, np.float32), want_total) <= tolerance(dtype)
    ref = rn.reference_rms_norm(want_total, _f64(row(w)), eps=1e-6)
    assert relative_error(np.asarray(y, np.float32), ref) <= tolerance(dtype)

    def loss(a, b, c, d):
        out, s = rn.rms_norm(a, c, eps=1e-6, residual=b, x_weight=d, implementation=impl, config=TILES, **kw)
        return jnp.sum(out.astype(jnp.float32) * dy.astype(jnp.float32)) + jnp.sum(s.astype(jnp.float32))
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(x, r, w, wx)
    for g in grads:
        assert np.all(np.isfinite(np.asarray(g, np.float32))) and float(jnp.max(jnp.abs(g.astype(jnp.float32)))) > 0
    with pytest.raises(ValueError, match="x_weight needs residual="):
        rn.rms_norm(x, w, eps=1e-6, x_weight=wx, **kw)
    with pytest.raises(ValueError, match="x_weight needs residual="):
        rn.rms_norm(x, w, eps=1e-6, residual=r, x_weight=wx[..., :128], **kw)
