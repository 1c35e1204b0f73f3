"""The torch-facing decode_attention (torch_api.py): torch-native and JAX (DLPack) paths against the NumPy reference,
gradients through the torch-native path, and the JAX path's refusal to run where gradients are needed."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

torch = pytest.importorskip("torch")
fa_torch = importlib.import_module("flash_attention.torch_api")
reference = importlib.import_module("flash_attention._vendor.attention_reference")


def _problem(seed: int, b: int, hq: int, hkv: int, s: int, d: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=g).to(dtype) for shape in ((b, hq, d), (b, hkv, s, d), (b, hkv, s, d)))
    lens = torch.randint(1, s + 1, (b,), generator=g, dtype=torch.int32)
    lens[0], lens[-1] = s, 0  # a full cache and an empty slot
    return q, k, v, lens


def _f64(t):
    return None if t is None else t.detach().double().numpy()


@pytest.mark.parametrize("impl", ["torch", "jax"])
@pytest.mark.parametrize(
    "dtype, hq, hkv, d, feats",
    [
        (torch.bfloat16, 8, 2, 64, dict(sinks=True, sliding_window=100)),
        (torch.float32, 4, 1, 128, dict(logits_soft_cap=20.0)),
        (torch.float32, 4, 4, 32, dict(sinks=True, sliding_window=1)),
    ],
)
def test_decode_matches_reference(impl, dtype, hq, hkv, d, feats):
    q, kc, vc, lens = _problem(hq * d, 5, hq, hkv, 300, d, dtype)
    kw = {key: val for key, val in feats.items() if key != "sinks"}
    sinks = torch.randn(hq, generator=torch.Generator().manual_seed(1)) if feats.get("sinks") else None
    out = fa_torch.decode_attention(q, kc, vc, lens, sinks=sinks, implementation=impl, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    expected = reference.reference_decode_attention(_f64(q), _f64(kc), _f64(vc), lens.numpy(), sinks=_f64(sinks), **kw)
    assert rel_error(out.float().numpy(), expected) <= TOL[str(dtype).removeprefix("torch.")]
    assert not out[-1].any()  # kv_len 0: nothing to attend
    assert fa_torch.last_implementation()[0] == impl


def test_decode_gradients_run_torch_native_where_the_jax_decode_cannot():
    q, kc, vc, lens = _problem(7, 3, 4, 2, 40, 16, torch.float32)
    lens[-1] = 17
    q.requires_grad_(True)
    out = fa_torch.decode_attention(q, kc, vc, lens, implementation=("jax", "torch"))
    name, trace = fa_torch.last_implementation()
    assert name == "torch" and "jax: skipped, refused at call: the JAX decode_attention is forward only" in trace
    (grad,) = torch.autograd.grad(out.sum(), q)
    # the JAX XLA prefill's gradient on the one query row (decode is the last row of a causal prefill)
    import flash_attention as fa_jax
    import jax
    import jax.numpy as jnp

    k_j, v_j, lens_j = jnp.asarray(kc.numpy()), jnp.asarray(vc.numpy()), jnp.asarray(lens.numpy())
    row = lambda x: fa_jax.flash_attention(x[:, :, None], k_j, v_j, causal=True, kv_lengths=lens_j,
                                           q_lengths=jnp.ones(3, jnp.int32), implementation="xla").sum()
    expected = np.asarray(jax.grad(row)(jnp.asarray(q.detach().numpy())))
    assert np.abs(grad.numpy() - expected).max() <= 1e-5 and np.abs(expected).sum() > 0
