"""The kernel's torch-facing entry: ragged_dot / moe_experts against NumPy, autograd, and the JAX bridge."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def np_ragged_dot(lhs, rhs, sizes):
    """Independent float64 loop: out[r] = lhs[r] @ rhs[g(r)], rows past sum(sizes) zero."""
    a, b = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out = np.zeros((a.shape[0], b.shape[2]))
    start = 0
    for g, s in enumerate(sizes):
        end = min(start + int(s), a.shape[0])
        out[start:end] = a[start:end] @ b[g]
        start = end
    return out


def f64(t):
    return t.detach().double().numpy()


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def test_kernel_is_the_torch_cpu_build(rd):
    info = rd.__kernel_hub__
    assert info.variant == "torch-cpu"
    assert {"ragged_dot", "moe_experts"} <= set(rd.__all__)
    assert rd.implementations_for("cpu")[0] == "torch" and rd.last_implementation is not None


@pytest.mark.parametrize("sizes", [[3, 0, 5, 2], [0, 0, 0, 0], [10, 0, 0, 0], [1, 2, 1, 1]])
@pytest.mark.parametrize("impl", ["torch", "jax"])
def test_ragged_dot_matches_numpy(rd, sizes, impl):
    g = torch.Generator().manual_seed(0)
    lhs = torch.randn(12, 16, generator=g)  # 12 rows: sums below 12 leave zero tail rows
    rhs = torch.randn(4, 16, 24, generator=g)
    gs = torch.tensor(sizes, dtype=torch.int32)
    out = rd.ragged_dot(lhs, rhs, gs, implementation=impl)
    ref = np_ragged_dot(f64(lhs), f64(rhs), sizes)
    assert out.shape == (12, 24) and out.dtype == torch.float32
    assert np.abs(f64(out) - ref).max() <= 1e-4 * max(np.abs(ref).max(), 1.0)
    assert not f64(out)[min(sum(sizes), 12):].any()  # rows past sum(group_sizes) are zero


@pytest.mark.parametrize("impl", ["torch", "jax"])
def test_ragged_dot_bf16_and_noncontiguous(rd, impl):
    g = torch.Generator().manual_seed(1)
    lhs = torch.randn(24, 32, generator=g).to(torch.bfloat16)[::2]  # strided rows
    rhs = torch.randn(3, 40, 32, generator=g).to(torch.bfloat16).transpose(1, 2)  # [G,K,N] view
    assert not lhs.is_contiguous() and not rhs.is_contiguous()
    sizes = [4, 5, 3]
    out = rd.ragged_dot(lhs, rhs, torch.tensor(sizes), implementation=impl)
    assert out.dtype == torch.bfloat16
    ref = np_ragged_dot(f64(lhs), f64(rhs), sizes)
    assert rel(f64(out), ref) <= 2e-2


@pytest.mark.parametrize("impl", ["torch", "jax"])
def test_ragged_dot_gradients_match_numpy(rd, impl):
    g = torch.Generator().manual_seed(2)
    lhs = torch.randn(10, 8, generator=g, requires_grad=True)
    rhs = torch.randn(3, 8, 6, generator=g, requires_grad=True)
    sizes = [4, 0, 5]  # one empty group (its gradient must be zero), one zero tail row
    dout = torch.randn(10, 6, generator=g)
    out = rd.ragged_dot(lhs, rhs, torch.tensor(sizes), implementation=impl)
    (out * dout).sum().backward()
    a, b, d = f64(lhs), f64(rhs), f64(dout)
    d_lhs, d_rhs = np.zeros_like(a), np.zeros_like(b)
    start = 0
    for grp, s in enumerate(sizes):
        d_lhs[start:start + s] = d[start:start + s] @ b[grp].T
        d_rhs[grp] = a[start:start + s].T @ d[start:start + s]
        start += s
    assert rel(f64(lhs.grad), d_lhs) <= 1e-5
    assert rel(f64(rhs.grad), d_rhs) <= 1e-5
    assert not f64(rhs.grad)[1].any()


def test_jax_bridge_builds_its_forward_and_backward_once(rd):
    """Training through the JAX bridge: the second differentiable call reuses the first call's forward and vjp
    function instead of rebuilding them (signature inspection included) on every call."""
    import sys

    bridge = next(m for n, m in sys.modules.items() if n.endswith(".torch_bridge") and hasattr(m, "ragged_dot_jax"))
    bridging = sys.modules[bridge.call_jax.__module__]
    g = torch.Generator().manual_seed(4)
    for step in range(3):
        lhs = torch.randn(6, 8, generator=g, requires_grad=True)
        rhs = torch.randn(2, 8, 5, generator=g, requires_grad=True)
        out = rd.ragged_dot(lhs, rhs, torch.tensor([2, 4]), implementation="jax")
        out.sum().backward()
        assert lhs.grad is not None and rhs.grad is not None and not torch.isnan(lhs.grad).any()
        if step == 0:
            before = bridging._cached_vjp.cache_info()
    after = bridging._cached_vjp.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 2
    assert bridge.ragged_dot_function(None, None) is bridge.ragged_dot_function(None, None)


def test_ragged_dot_rejects_bad_shapes(rd):
    with pytest.raises(ValueError, match="shapes disagree"):
        rd.ragged_dot(torch.zeros(4, 8), torch.zeros(2, 7, 3), torch.tensor([2, 2]))
    with pytest.raises(TypeError, match="integer"):
        rd.ragged_dot(torch.zeros(4, 8), torch.zeros(2, 8, 3), torch.tensor([2.0, 2.0]))


def np_moe(x, idx, w, gate_up, down, *, transposed, concatenated, gated=True, bias=None):
    """Float64 expert block, one token and one expert at a time (SiLU gate)."""
    silu = lambda v: v / (1 + np.exp(-v))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(idx[t]):
            if e >= gate_up.shape[0]:
                continue
            wu = gate_up[e] if transposed else gate_up[e].T  # [H, 2I]
            wd = down[e] if transposed else down[e].T  # [I, H]
            h = x[t] @ wu + (bias[0][e] if bias else 0)
            if gated:
                g, u = (h[: h.size // 2], h[h.size // 2:]) if concatenated else (h[0::2], h[1::2])
                h = silu(g) * u
            else:
                h = silu(h)
            out[t] += w[t, j] * (h @ wd + (bias[1][e] if bias else 0))
    return out


@pytest.mark.parametrize("transposed,concatenated,gated,with_bias", [
    (False, True, True, False), (True, False, True, True), (True, True, True, False), (False, True, False, False),
])
def test_moe_experts_layouts_match_numpy(rd, transposed, concatenated, gated, with_bias):
    g = torch.Generator().manual_seed(3)
    e, h, i, t, k = 6, 16, 10, 7, 2
    width = 2 * i if gated else i
    gate_up = torch.randn((e, h, width) if transposed else (e, width, h), generator=g) * 0.3
    down = torch.randn((e, i, h) if transposed else (e, h, i), generator=g) * 0.3
    bias = (torch.randn(e, width, generator=g), torch.randn(e, h, generator=g)) if with_bias else None
    x = torch.randn(t, h, generator=g)
    idx = torch.argsort(torch.rand(t, e, generator=g), dim=1)[:, :k]
    idx[0, 1] = e  # an expert-parallel sentinel: dropped
    w = torch.softmax(torch.randn(t, k, generator=g), -1)
    out = rd.moe_experts(
        x, idx, w, gate_up, down, is_transposed=transposed, is_concatenated=concatenated, has_gate=gated,
        gate_up_proj_bias=bias[0] if bias else None, down_proj_bias=bias[1] if bias else None,
    )
    ref = np_moe(f64(x), idx.numpy(), f64(w), f64(gate_up), f64(down), transposed=transposed,
                 concatenated=concatenated, gated=gated, bias=tuple(f64(b) for b in bias) if bias else None)
    assert rel(f64(out), ref) <= 1e-5


def test_dlpack_bridge_is_zero_copy(rd):
    jax = pytest.importorskip("jax")
    torch_bridge = importlib.import_module(f"{rd.__name__}._vendor.torch_jax")  # the hand-over both bridges use
    for dtype in (torch.float32, torch.bfloat16):
        t = torch.randn(64, 32).to(dtype)
        a = torch_bridge.to_jax(t)
        assert a.unsafe_buffer_pointer() == t.data_ptr()  # same memory: no copy
        back = torch_bridge.to_torch(a)
        assert back.data_ptr() == t.data_ptr() and back.dtype == dtype
        assert isinstance(a, jax.Array)
    strided = torch.randn(8, 8)[:, ::2]
    assert np.array_equal(np.asarray(torch_bridge.to_jax(strided)), strided.numpy())


def test_torch_cpu_build_never_imports_jax():
    """The torch-cpu build must run where only torch is installed: jax stays out of sys.modules."""
    code = textwrap.dedent("""
        import sys, torch, kernel_hub
        k = kernel_hub.get_kernel("kernel-hub/ragged-dot-tpu", framework="torch", backend="cpu")
        out = k.moe_experts(torch.randn(4, 8), torch.tensor([[0, 1]] * 4), torch.ones(4, 2) / 2,
                            torch.randn(3, 12, 8), torch.randn(3, 8, 6))
        assert out.shape == (4, 8)
        print("jax" in sys.modules, "torch_tpu" in sys.modules)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "False"]
