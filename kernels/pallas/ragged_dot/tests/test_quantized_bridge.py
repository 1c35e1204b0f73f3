"""The torch ragged dot on quantized weights through the JAX bridge (implementation="jax"): the call_jax (DLPack) path
on CPU, the one a TPU runs as the op `<namespace>::ragged_dot_quantized` (torch_bridge.py).

Against the float64 NumPy reference of test_quantized_torch.py (quant_testutil: the
dequantized weights summed in float64): int8 per-channel and float8_e4m3fn block scales, bfloat16 and float32 lhs,
every tail (empty groups, one row, one group holding all rows, K and N not multiples of 128, rows past
sum(group_sizes)). The gradient in lhs against dout @ W^T per group; none for rhs or rhs_scale. "torch" and "jax" agree
and refuse the same bad arguments. The registration side (the spec list, the schema) is checked here off TPU, and
against the real torch_tpu in tests/tpu_env/torch_tpu_checks.py.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from quant_testutil import dequantize64  # noqa: E402
from quant_testutil import reference as group_reference  # noqa: E402

from kernel_hub.verify.numerics import relative_error, tolerance  # noqa: E402

DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
LHS = {"bf16": torch.bfloat16, "f32": torch.float32}
#: float32 lhs: the JAX CPU path sums float32 products of exact weights (int8 values, e4m3 bytes times f32 scales).
F32_BOUND = 1e-5

CASES = {  # name: (K, N, group sizes, M)
    "tails": (200, 136, [0, 1, 3, 0, 17, 5], 30),  # empty groups, a one-row group, rows past the sum, partial blocks
    "one_group_all_rows": (130, 129, [0, 12, 0], 12),
    "single_rows": (64, 40, [1, 1, 1, 1], 4),
    "big_group": (257, 260, [40, 2], 42),
    "all_empty": (96, 72, [0, 0, 0], 5),
}


@pytest.fixture(scope="module")
def bridge(rd):
    import importlib

    return importlib.import_module(f"{rd.__name__}.torch_bridge")


def scale_np(q: torch.Tensor, s: torch.Tensor) -> np.ndarray:
    """The float64 weights [G, K, N] rhs stands for (float8 bytes through torch's own cast)."""
    return dequantize64(q.to(torch.float32).numpy(), s.numpy(), "int8" if q.dtype == torch.int8 else "fp8")


def reference(lhs: torch.Tensor, w64: np.ndarray, sizes: list[int]) -> np.ndarray:
    return group_reference(lhs.detach().to(torch.float32).numpy().astype(np.float64), w64, sizes)


def operands(rd, fmt: str, g: int, k: int, n: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A quantized rhs stored nn.Linear-style ([G, N, K] bytes seen as [G, K, N], what kernelize makes), its scales."""
    gen = torch.Generator().manual_seed(seed)
    q, s = rd.quantize(torch.randn(g, k, n, generator=gen) / k ** 0.5, DTYPES[fmt])
    return q.transpose(1, 2).contiguous().transpose(1, 2), s


def bound(dtype: torch.dtype) -> float:
    return F32_BOUND if dtype == torch.float32 else tolerance("bfloat16")


@pytest.mark.parametrize("lhs_dtype", list(LHS))
@pytest.mark.parametrize("fmt", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
def test_jax_bridge_matches_float64_of_the_dequantized_weights(rd, case, fmt, lhs_dtype):
    k, n, sizes, m = CASES[case]
    q, s = operands(rd, fmt, len(sizes), k, n, seed=len(case))
    lhs = torch.randn(m, k, generator=torch.Generator().manual_seed(7)).to(LHS[lhs_dtype])
    out = rd.ragged_dot(lhs, q, torch.tensor(sizes, dtype=torch.int32), rhs_scale=s, implementation="jax")
    assert rd.last_implementation()[0] == "jax"
    assert out.dtype == LHS[lhs_dtype] and out.shape == (m, n)
    err = relative_error(out, reference(lhs, scale_np(q, s), sizes))
    assert err <= bound(LHS[lhs_dtype]), err
    assert torch.count_nonzero(out[sum(sizes):]) == 0  # rows past sum(group_sizes) are zero


@pytest.mark.parametrize("fmt", list(DTYPES))
def test_torch_and_jax_agree_and_keep_preferred_element_type(rd, fmt):
    k, n, sizes, m = CASES["tails"]
    q, s = operands(rd, fmt, len(sizes), k, n, seed=3)
    gs = torch.tensor(sizes)
    for lhs_dtype in LHS.values():
        lhs = torch.randn(m, k, generator=torch.Generator().manual_seed(8)).to(lhs_dtype)
        by = {impl: rd.ragged_dot(lhs, q, gs, rhs_scale=s, implementation=impl) for impl in ("torch", "jax")}
        assert by["torch"].dtype == by["jax"].dtype == lhs_dtype
        assert relative_error(by["jax"], by["torch"]) <= bound(lhs_dtype)
    lhs = torch.randn(m, k, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    ref = reference(lhs, scale_np(q, s), sizes)
    for impl in ("torch", "jax"):  # the result in preferred_element_type when given
        out = rd.ragged_dot(lhs, q, gs, rhs_scale=s, preferred_element_type=torch.float32, implementation=impl)
        assert out.dtype == torch.float32 and relative_error(out, ref) <= tolerance("bfloat16")
    # no implementation named on CPU: the torch-native path, as before
    rd.ragged_dot(lhs, q, gs, rhs_scale=s)
    assert rd.last_implementation()[0] == "torch"


@pytest.mark.parametrize("lhs_dtype", list(LHS))
@pytest.mark.parametrize("fmt", list(DTYPES))
def test_gradient_in_lhs_only_against_float64(rd, fmt, lhs_dtype):
    k, n, sizes = 140, 70, [2, 0, 19, 1]
    q, s = operands(rd, fmt, len(sizes), k, n)
    gen = torch.Generator().manual_seed(5)
    lhs = torch.randn(sum(sizes) + 2, k, generator=gen).to(LHS[lhs_dtype]).requires_grad_(True)
    dout = torch.randn(lhs.shape[0], n, generator=gen).to(LHS[lhs_dtype])
    out = rd.ragged_dot(lhs, q, torch.tensor(sizes), rhs_scale=s, implementation="jax")
    (grad,) = torch.autograd.grad((out * dout).sum(), lhs)
    assert grad.dtype == lhs.dtype and grad.shape == lhs.shape
    w64 = scale_np(q, s)
    want = np.zeros((lhs.shape[0], k))
    start = 0
    for g, size in enumerate(sizes):  # d lhs = dout @ W^T per group, float64
        want[start:start + size] = dout[start:start + size].double().numpy() @ w64[g].T
        start += size
    err = relative_error(grad, want)
    assert err <= bound(LHS[lhs_dtype]), err
    assert torch.count_nonzero(grad[sum(sizes):]) == 0  # rows past the groups get no gradient
    assert q.grad is None and s.grad is None and not q.requires_grad and not s.requires_grad


def test_a_float8_rhs_that_requires_grad_gets_none(rd):
    """float8 is a floating dtype, so its tensor may require grad: the bridge still differentiates lhs only."""
    q, s = operands(rd, "fp8", 3, 130, 40)
    q = q.detach().requires_grad_(True)
    lhs = torch.randn(6, 130, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    out = rd.ragged_dot(lhs, q, torch.tensor([2, 1, 3]), rhs_scale=s, implementation="jax")
    d_lhs, d_q = torch.autograd.grad(out.sum(), (lhs, q), allow_unused=True)
    assert d_lhs is not None and d_q is None


def test_nan_never_passes(rd):
    """A NaN in lhs reaches exactly its row's outputs, and the comparison then fails (relative_error is inf). A NaN in
    a scale: the JAX entry checks concrete scales and refuses them naming rhs_scale (torch-native propagates it)."""
    k, n, sizes = 150, 140, [3, 0, 4, 2]
    for fmt in DTYPES:
        q, s = operands(rd, fmt, len(sizes), k, n)
        lhs = torch.randn(sum(sizes), k, generator=torch.Generator().manual_seed(3))
        lhs[4, 9] = float("nan")
        out = rd.ragged_dot(lhs, q, torch.tensor(sizes), rhs_scale=s, implementation="jax")
        assert bool(out[4].isnan().all()) and not bool(out[[0, 1, 2, 3, 5, 6, 7, 8]].isnan().any())
        assert relative_error(out, reference(lhs, scale_np(q, s), sizes)) == float("inf")
        bad = s.clone()
        bad[2, 0, 0] = float("nan")
        with pytest.raises(ValueError, match="rhs_scale holds NaN or inf"):
            rd.ragged_dot(lhs, q, torch.tensor(sizes), rhs_scale=bad, implementation="jax")


def test_moe_experts_with_scales_runs_both_projections_through_the_bridge(rd, bridge, monkeypatch):
    """implementation="jax": the two quantized projections go through ragged_dot_quantized_jax (counted), not the CPU
    inference fast path, and equal the torch-native block within bf16 tolerance."""
    e, h, i, t = 5, 136, 72, 9
    gen = torch.Generator().manual_seed(11)
    up, s_up = rd.quantize(torch.randn(e, h, 2 * i, generator=gen) / h ** 0.5, torch.float8_e4m3fn)
    down, s_down = rd.quantize(torch.randn(e, i, h, generator=gen) / i ** 0.5, torch.float8_e4m3fn)
    x = torch.randn(t, h, generator=gen).to(torch.bfloat16)
    ids = torch.argsort(torch.rand(t, e, generator=gen), dim=1)[:, :2]
    ids[0, 1] = e  # an expert-parallel sentinel
    weights = torch.softmax(torch.randn(t, 2, generator=gen), dim=-1).to(torch.bfloat16)
    kwargs = {"is_transposed": True, "w_gate_up_scale": s_up, "w_down_scale": s_down}
    calls = []
    real = bridge.ragged_dot_quantized_jax
    monkeypatch.setattr(bridge, "ragged_dot_quantized_jax", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    with torch.no_grad():
        via_jax = rd.moe_experts(x, ids, weights, up, down, implementation="jax", **kwargs)
        assert len(calls) == 2
        native = rd.moe_experts(x, ids, weights, up, down, implementation="torch", **kwargs)
    assert len(calls) == 2 and via_jax.dtype == torch.bfloat16
    assert relative_error(via_jax, native) <= tolerance("bfloat16")


def test_tpu_tensors_take_the_registered_quantized_op(rd, bridge, monkeypatch):
    """On TPU tensors the bridge calls TPU_OPS' ragged_dot_quantized (stood in for here), int32 sizes, the options as
    keywords; the torch entry's dispatch tries "jax" first there."""
    seen = []

    def fake_op(*tensors, preferred_element_type):
        seen.append(([t.dtype for t in tensors], preferred_element_type))
        return torch.zeros(tensors[0].shape[0], tensors[1].shape[2], dtype=preferred_element_type)

    monkeypatch.setattr(bridge, "on_tpu", lambda *tensors: True)
    monkeypatch.setattr(bridge.TPU_OPS, "get", lambda entry: fake_op if entry == "ragged_dot_quantized" else None)
    q, s = operands(rd, "int8", 2, 32, 16)
    out = bridge.ragged_dot_quantized_jax(torch.randn(3, 32), q, s, torch.tensor([1, 2]),
                                          preferred_element_type=torch.bfloat16)
    assert out.shape == (3, 16) and seen == [([torch.float32, torch.int8, torch.float32, torch.int32],
                                              torch.bfloat16)]
    assert rd.implementations_for("tpu")[0] == "jax" and rd.implementations_for("cpu")[0] == "torch"


def test_the_torch_tpu_build_lists_the_quantized_op_with_rhs_scale(bridge):
    specs = {spec.entry: spec for spec in bridge.tpu_specs()}
    assert set(specs) == {"ragged_dot", "ragged_dot_quantized", "experts_forward", "experts_forward_bias"}
    quantized = specs["ragged_dot_quantized"]
    params = inspect.signature(quantized.forward, eval_str=True).parameters
    assert list(params) == ["lhs", "rhs", "rhs_scale", "group_sizes", "preferred_element_type"]
    assert params["preferred_element_type"].kind is inspect.Parameter.KEYWORD_ONLY
    assert 0 in quantized.differentiable and 1 not in quantized.differentiable  # lhs, never the quantized bytes
    assert bridge.TPU_OPS.name("ragged_dot_quantized") == f"{bridge.TPU_OPS.namespace}::ragged_dot_quantized"
    names = {bridge.TPU_OPS.name(e) for e in specs} | {bridge.TPU_OPS.name(f"{e}_backward") for e in specs}
    assert len(names) == 2 * len(specs)  # each entry and its backward, all distinct
