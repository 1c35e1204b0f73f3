"""The torch ragged dot and moe_experts with quantized weights (rhs_scale: int8 per channel, float8_e4m3fn 128x128
blocks), against a float64 NumPy reference of the dequantized weights.

The reference dequantizes with NumPy (int8 values; float8 bytes through torch's own float8 -> float32 cast, which
the native kernel's decoder does not use) and sums in float64. Every tail: empty groups, one row, a group holding all
rows, rows past sum(group_sizes), K and N not multiples of 16 or 128 (partial blocks), groups past the native
kernel's MAX_ROWS (the dequantize-and-matmul route) and a [G, K, N]-contiguous rhs (never native); bfloat16 and
float32 lhs. NaN/Inf in scales, bad scales, gradients (lhs only) and torch.compile(fullgraph=True).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from quant_testutil import dequantize64  # noqa: E402
from quant_testutil import reference as group_reference  # noqa: E402

from kernel_hub.verify.numerics import relative_error, tolerance  # noqa: E402

DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}


def _module(rd, name):
    return sys.modules[f"{rd.__name__}.{name}"]


@pytest.fixture(params=["chosen", "avx2"])
def nq(request, rd, monkeypatch):
    """The native quantized module on the build this CPU chooses, then forced onto its AVX2 build (every CPU running
    the AVX512 build runs it too), so both builds' numbers are checked wherever AVX512 is present."""
    module = _module(rd, "torch_cpu.native_quant")
    rows = module.native_rows
    if request.param == "avx2":
        if not all(f in rows.cpu_flags() for f in rows.AVX2_FLAGS):
            pytest.skip("this CPU lacks AVX2")
        monkeypatch.setattr(module, "isa", lambda: rows.Isa("AVX2", "_avx2", rows.AVX2_FLAGS))
    module.available.cache_clear()
    module.x16_available.cache_clear()
    yield module
    module.available.cache_clear()
    module.x16_available.cache_clear()


def scale_np(q: torch.Tensor, s: torch.Tensor) -> np.ndarray:
    """The float64 weights rhs stands for ([G, K, N]), NumPy only (float8 bytes through torch's own cast)."""
    return dequantize64(q.to(torch.float32).numpy(), s.numpy(), "int8" if q.dtype == torch.int8 else "fp8")


def reference(lhs: torch.Tensor, w64: np.ndarray, sizes: list[int]) -> np.ndarray:
    return group_reference(lhs.to(torch.float32).numpy().astype(np.float64), w64, sizes)


def operands(rd, fmt, g, k, n, *, linear_style=True, seed=0):
    """A random quantized rhs (the kernel's own quantize of Gaussian weights; the reference reads only the bytes and
    scales it returns) stored nn.Linear-style ([G, N, K] bytes seen as [G, K, N]) or [G, K, N]-contiguous."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(g, k, n, generator=gen) / k ** 0.5
    q, s = rd.quantize(w, DTYPES[fmt])
    if linear_style:
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    return q, s


CASES = {  # name: (K, N, group sizes, M)
    "tails": (200, 136, [0, 1, 3, 0, 17, 5], 30),  # rows past the sum, a group past MAX_ROWS, partial blocks
    "one_group_all_rows": (130, 129, [0, 12, 0], 12),
    "single_rows": (64, 40, [1, 1, 1, 1], 4),
    "big_group": (257, 260, [40, 2], 42),
}


@pytest.mark.parametrize("lhs_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("fmt", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("linear_style", [True, False], ids=["nn_linear_bytes", "gkn_bytes"])
def test_matches_float64_of_the_dequantized_weights(rd, case, fmt, lhs_dtype, linear_style):
    k, n, sizes, m = CASES[case]
    q, s = operands(rd, fmt, len(sizes), k, n, linear_style=linear_style, seed=len(case))
    lhs = torch.randn(m, k, generator=torch.Generator().manual_seed(7)).to(lhs_dtype)
    out = rd.ragged_dot(lhs, q, torch.tensor(sizes, dtype=torch.int32), rhs_scale=s)
    assert out.dtype == lhs_dtype and out.shape == (m, n)
    ref = reference(lhs, scale_np(q, s), sizes)
    bound = 1e-5 if lhs_dtype == torch.float32 else tolerance("bfloat16")
    assert relative_error(out, ref) <= bound
    covered = sum(sizes)
    assert torch.count_nonzero(out[covered:]) == 0  # rows past sum(group_sizes) are zero


def test_the_native_kernel_runs_and_agrees_with_the_dequantize_route(rd, nq, monkeypatch):
    """Decode-sized groups on nn.Linear-style bytes take the native kernel (counted); the same call with the kernel
    switched off (the dequantize-and-matmul route) agrees to float32 rounding."""
    for dtype in DTYPES.values():
        ok, why = nq.available(dtype)
        if not ok:
            pytest.skip(f"no native quantized kernel here: {why}")
    calls = []
    real = nq.grouped
    monkeypatch.setattr(nq, "grouped", lambda *a: (calls.append(1), real(*a))[1])
    for fmt in DTYPES:
        q, s = operands(rd, fmt, 5, 300, 150)
        lhs = torch.randn(12, 300, generator=torch.Generator().manual_seed(1))
        sizes = torch.tensor([3, 0, 4, 1, 4])
        native = rd.ragged_dot(lhs, q, sizes, rhs_scale=s)
        monkeypatch.setattr(_module(rd, "torch_cpu.quantized_ragged_dot"), "_native_ready", lambda *a: False)
        fallback = rd.ragged_dot(lhs, q, sizes, rhs_scale=s)
        monkeypatch.undo()
        monkeypatch.setattr(nq, "grouped", lambda *a: (calls.append(1), real(*a))[1])
        assert relative_error(native, fallback) <= 1e-6
    assert calls, "the native kernel never ran"


def test_float8_decoder_is_exact_for_every_byte(nq):
    """All 256 e4m3fn bytes (normals, subnormals, +-0, NaN) through the native kernel with x = identity and scale 1
    equal torch's own float8 -> float32 cast, in its vector part (K = 16) and its scalar K tail (K = 1)."""
    ok, why = nq.available(torch.float8_e4m3fn)
    if not ok:
        pytest.skip(why)
    w = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).reshape(16, 16)  # [N, K]
    out = nq._rows(torch.eye(16), w.contiguous(), torch.ones(1, 1))
    want = w.to(torch.float32).t()  # out[m, n] = w[n, m]
    nan_rows = want.isnan().any(dim=0)  # the weight rows holding 0x7f / 0xff: 0 * NaN is NaN in every output
    assert int(want.isnan().sum()) == 2 and int(nan_rows.sum()) == 2
    assert bool(out[:, nan_rows].isnan().all())
    assert torch.equal(out[:, ~nan_rows], want[:, ~nan_rows])  # exact (a sum of products cannot keep -0.0's sign)
    column = w.reshape(256, 1).contiguous()  # [N=256, K=1]: every byte in the K tail
    tail = nq._rows(torch.ones(1, 1), column, torch.ones(1, 2))[0]
    want = column.to(torch.float32)[:, 0]
    assert torch.equal(tail.isnan(), want.isnan()) and int(want.isnan().sum()) == 2
    assert torch.equal(tail[~want.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("fmt", list(DTYPES))
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nan_and_inf_in_scales_reach_exactly_the_outputs_they_scale(rd, fmt, bad):
    k, n, sizes = 150, 140, [3, 0, 20, 2]
    q, s = operands(rd, fmt, len(sizes), k, n)
    s = s.clone()
    s[2, 0, 1] = bad  # group 2: int8 channel 1 / fp8 block (k 0..127, n 128..139)
    lhs = torch.randn(sum(sizes), k, generator=torch.Generator().manual_seed(3))
    for out in (rd.ragged_dot(lhs, q, torch.tensor(sizes), rhs_scale=s),
                rd.ragged_dot(lhs[:5], q, torch.tensor([3, 0, 2, 0]), rhs_scale=s)):  # native-sized groups
        rows = slice(3, 3 + (20 if out.shape[0] > 5 else 2))
        cols = [1] if fmt == "int8" else list(range(128, n))
        expected = torch.zeros_like(out, dtype=torch.bool)
        expected[rows, cols] = True
        assert torch.equal(~out.isfinite(), expected)
        assert relative_error(out, np.zeros(out.shape)) == float("inf")  # NaN/Inf never passes


@pytest.mark.parametrize("impl", ["torch", "jax"])
def test_bad_scales_get_one_value_error_naming_the_argument(rd, impl):
    """The same ValueError, naming the argument, whichever implementation would run (arguments are checked once,
    before dispatch)."""
    q8, s8 = operands(rd, "int8", 3, 40, 24)
    qf, sf = operands(rd, "fp8", 3, 200, 130)
    lhs8, lhsf = torch.randn(4, 40), torch.randn(4, 200)
    sizes = torch.tensor([1, 2, 1])
    cases = [
        (lhs8, q8, s8.to(torch.float16), "rhs_scale must be float32"),
        (lhs8, q8, s8.double(), "rhs_scale must be float32"),
        (lhs8, q8, s8[:, :, :-1], r"rhs_scale must have shape \[3, 1, 24\]"),
        (lhs8, q8, s8.reshape(3, 24, 1), r"rhs_scale must have shape \[3, 1, 24\]"),
        (lhsf, qf, sf[:, :1], r"rhs_scale must have shape \[3, 2, 2\]"),
        (lhsf, qf, torch.ones(3, 1, 130), r"rhs_scale must have shape \[3, 2, 2\]"),
        (lhs8, q8, None, "pass its float32 rhs_scale"),
        (lhs8, q8.to(torch.float32), s8, "rhs_scale is given, so rhs must be int8"),
        (lhs8.half(), q8, s8, "lhs must be bfloat16 or float32"),
        (lhs8, q8, s8.tolist(), "rhs_scale must be a torch.Tensor"),
        (lhs8.clone().requires_grad_(True), q8, s8.clone().requires_grad_(True), "rhs_scale requires grad"),
    ]
    for lhs, rhs, scale, message in cases:
        with pytest.raises(ValueError, match=message):
            rd.ragged_dot(lhs, rhs, sizes, rhs_scale=scale, implementation=impl)


@pytest.mark.parametrize("fmt", list(DTYPES))
def test_gradient_flows_to_lhs_only(rd, fmt):
    k, n, sizes = 140, 70, [2, 0, 19, 1]
    q, s = operands(rd, fmt, len(sizes), k, n)
    gen = torch.Generator().manual_seed(5)
    lhs = torch.randn(sum(sizes) + 2, k, generator=gen).requires_grad_(True)
    dout = torch.randn(lhs.shape[0], n, generator=gen)
    out = rd.ragged_dot(lhs, q, torch.tensor(sizes), rhs_scale=s)
    (grad,) = torch.autograd.grad((out * dout).sum(), lhs)
    w64 = scale_np(q, s)
    want = np.zeros((lhs.shape[0], k))
    start = 0
    for g, size in enumerate(sizes):
        want[start:start + size] = dout[start:start + size].double().numpy() @ w64[g].T
        start += size
    assert relative_error(grad, want) <= 1e-5
    assert torch.count_nonzero(grad[sum(sizes):]) == 0


def _moe_reference(x, ids, weights, w_up, w_down, b_up=None, b_down=None, *, interleaved=False):
    """float64 loop over tokens and slots: [E, H, 2I] / [E, I, H] (rhs orientation), SiLU gate."""
    x64, out = x.double().numpy(), np.zeros((x.shape[0], w_down.shape[2]))
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = x64[t] @ w_up[e] + (0 if b_up is None else b_up[e])
            g, u = (h[0::2], h[1::2]) if interleaved else np.split(h, 2)
            y = (g / (1 + np.exp(-g)) * u) @ w_down[e] + (0 if b_down is None else b_down[e])
            out[t] += float(weights[t, j]) * y
    return out


@pytest.mark.parametrize("fmt", list(DTYPES))
@pytest.mark.parametrize("transposed", [False, True], ids=["nn_linear", "transposed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_moe_experts_with_scales_matches_float64(rd, fmt, transposed, dtype):
    """Scales laid out like their weights: nn.Linear-style weights [E, N, K] take [E, N, 1] / [E, N/128, K/128]
    (transformers' weight_scale_inv), transposed ones [E, 1, N] / [E, K/128, N/128]. Interleaved gate/up and biases
    (GPT-OSS's layout) in the transposed case."""
    e, h, i, t = 6, 136, 72, 9
    gen = torch.Generator().manual_seed(11)
    up_rhs, s_up = rd.quantize(torch.randn(e, h, 2 * i, generator=gen) / h ** 0.5, DTYPES[fmt])
    down_rhs, s_down = rd.quantize(torch.randn(e, i, h, generator=gen) / i ** 0.5, DTYPES[fmt])
    x = torch.randn(t, h, generator=gen).to(dtype)
    ids = torch.argsort(torch.rand(t, e, generator=gen), dim=1)[:, :2]
    ids[0, 1] = e  # an expert-parallel sentinel: contributes nothing
    weights = torch.softmax(torch.randn(t, 2, generator=gen), dim=-1).to(dtype)
    kwargs = {}
    b_up = b_down = None
    if transposed:
        b_up, b_down = torch.randn(e, 2 * i, generator=gen).to(dtype), torch.randn(e, h, generator=gen).to(dtype)
        kwargs = {"gate_up_proj_bias": b_up, "down_proj_bias": b_down, "is_concatenated": False}
        args = (up_rhs, down_rhs, s_up, s_down)
    else:
        args = (up_rhs.transpose(1, 2).contiguous(), down_rhs.transpose(1, 2).contiguous(),
                s_up.transpose(1, 2), s_down.transpose(1, 2))
    out = rd.moe_experts(x, ids, weights, args[0], args[1], is_transposed=transposed, w_gate_up_scale=args[2],
                         w_down_scale=args[3], **kwargs)
    assert out.dtype == dtype
    ids_ref = ids.clone()
    weights_ref = weights.float().clone()
    weights_ref[0, 1] = 0.0
    ids_ref[0, 1] = 0
    ref = _moe_reference(x, ids_ref, weights_ref, scale_np(up_rhs, s_up), scale_np(down_rhs, s_down),
                         None if b_up is None else b_up.double().numpy(),
                         None if b_down is None else b_down.double().numpy(), interleaved=transposed)
    # bf16: the kernel rounds the hidden activations to bf16 between the projections, as the unquantized path does
    assert relative_error(out, ref) <= (1e-5 if dtype == torch.float32 else tolerance("bfloat16"))


def test_torch_compile_fullgraph_on_the_quantized_path(rd):
    """dynamo traces the quantized ragged dot (its custom op and fake implementation) without a graph break, forward
    and backward (aot_eager: the fake-tensor pass is what the op must survive), equal to eager."""
    for fmt in DTYPES:
        q, s = operands(rd, fmt, 4, 136, 130)
        sizes = torch.tensor([2, 0, 5, 1])

        def f(x, q=q, s=s, sizes=sizes):
            return torch.nn.functional.silu(rd.ragged_dot(x, q, sizes, rhs_scale=s)).sum(dim=1)

        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        x = torch.randn(9, 136, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).requires_grad_(True)
        eager = f(x)
        (g_eager,) = torch.autograd.grad(eager.float().sum(), x)
        got = compiled(x)
        (g_got,) = torch.autograd.grad(got.float().sum(), x)
        assert torch.equal(got, eager)
        assert torch.equal(g_got, g_eager)


@pytest.mark.parametrize("fmt", list(DTYPES))
def test_moe_experts_inference_route_equals_the_differentiable_one(rd, fmt):
    """At CPU inference moe_experts takes torch_cpu/quantized_ragged_dot.py moe_experts_quantized (glue on a pool
    worker); with autograd on it runs the two ragged dots: the same computation, so the same bits. Biases and a
    sentinel id included."""
    e, h, i, t = 5, 96, 40, 11
    gen = torch.Generator().manual_seed(4)
    up, s_up = rd.quantize(torch.randn(e, h, 2 * i, generator=gen), DTYPES[fmt])
    down, s_down = rd.quantize(torch.randn(e, i, h, generator=gen), DTYPES[fmt])
    x = torch.randn(t, h, generator=gen).to(torch.bfloat16)
    ids = torch.argsort(torch.rand(t, e, generator=gen), dim=1)[:, :2]
    ids[3, 0] = e
    weights = torch.softmax(torch.randn(t, 2, generator=gen), dim=-1).to(torch.bfloat16)
    biases = {"gate_up_proj_bias": torch.randn(e, 2 * i, generator=gen).to(torch.bfloat16),
              "down_proj_bias": torch.randn(e, h, generator=gen).to(torch.bfloat16)}
    args = (ids, weights, up, down)
    kwargs = {"is_transposed": True, "w_gate_up_scale": s_up, "w_down_scale": s_down, **biases}
    calls = []
    module = _module(rd, "torch_cpu.quantized_ragged_dot")
    real = module.moe_experts_quantized
    module_api = sys.modules[rd.__name__]
    module_api.moe_experts_quantized, saved = (lambda *a, **k: (calls.append(1), real(*a, **k))[1]), real
    try:
        with torch.no_grad():
            fast = rd.moe_experts(x, *args, **kwargs)
        slow = rd.moe_experts(x.clone().requires_grad_(True), *args, **kwargs)
    finally:
        module_api.moe_experts_quantized = saved
    assert calls == [1]
    assert torch.equal(fast, slow.detach())


def test_int8_vnni_route_runs_for_bf16_lhs_and_leaves_nan_rows_to_the_float32_route(rd, nq, monkeypatch):
    """bf16 lhs x int8 weights at decode sizes take the int16-lhs route (VNNI on AVX512, VPMADDWD on AVX2; lhs rows as
    14-bit int16, counted) within the bf16 tolerance of float64; an lhs holding NaN takes the float32 route, where
    NaN stays in its row."""
    ok, why = nq.x16_available()
    if not ok:
        pytest.skip(why)
    calls = []
    real = nq.grouped_x16
    monkeypatch.setattr(nq, "grouped_x16", lambda *a: (calls.append(1), real(*a))[1])
    k, n, sizes = 1100, 136, [2, 0, 5, 1]  # K past one int32 span of the C kernel
    q, s = operands(rd, "int8", len(sizes), k, n)
    lhs = torch.randn(sum(sizes), k, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    out = rd.ragged_dot(lhs, q, torch.tensor(sizes), rhs_scale=s)
    assert calls and relative_error(out, reference(lhs, scale_np(q, s), sizes)) <= tolerance("bfloat16")
    calls.clear()
    lhs[3, 7] = float("nan")
    poisoned = rd.ragged_dot(lhs, q, torch.tensor(sizes), rhs_scale=s)
    assert not calls
    assert bool(poisoned[3].isnan().all()) and not bool(poisoned[[0, 1, 2, 4, 5, 6, 7]].isnan().any())


def _require_x16_route(nq) -> None:
    """Skip where this CPU has no int16-lhs route (no native kernel, or no VNNI on the AVX512 build); where it has
    one, its self-test must pass (a broken C pass would otherwise only turn the route off)."""
    if not nq.available(torch.int8)[0]:
        pytest.skip(nq.available(torch.int8)[1])
    if nq.x16_suffix(nq.isa(), nq._flags()) is None:
        pytest.skip("this CPU has no int16-lhs route")
    ok, why = nq.x16_available()
    assert ok, why


def _x16_steps(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int16-lhs rows as whole-tensor torch steps (the route's definition, independent of its C pass): per row
    amax |x|, scale amax / (2^XBITS - 1) (1 for a zero row), rows round-half-even(x * (1 / scale)) in float32."""
    amax = x.abs().amax(dim=1).to(torch.float32)
    scale = torch.where(amax > 0, amax / (2 ** 14 - 1), torch.ones_like(amax))
    return x.to(torch.float32).mul_((1.0 / scale)[:, None]).round_().to(torch.int16), scale


@pytest.mark.parametrize("k", [1, 15, 31, 32, 33, 1100])
def test_x16_rows_native_pass_equals_the_torch_steps_bit_for_bit(nq, k):
    """The C pass that turns bf16 rows into the int16-lhs route's rows and scales computes exactly the torch steps:
    every K tail of both builds' vector loops, rows spanning six decades, a zero row, a subnormal, and a row holding
    Inf or NaN sends the whole lhs back (None)."""
    _require_x16_route(nq)
    assert nq.XBITS == 14
    g = torch.Generator().manual_seed(k)
    x = (torch.randn(9, k, generator=g) * torch.logspace(-3, 3, 9)[:, None]).to(torch.bfloat16)
    x[3] = 0.0
    x[4, k // 2] = 1e-40  # subnormal in bf16
    rows, scales = nq.x16_rows(x)
    want_rows, want_scales = _x16_steps(x)
    assert torch.equal(scales, want_scales) and torch.equal(rows, want_rows)
    assert int(rows.abs().max()) == 2 ** 14 - 1 and not bool(rows[3].any())
    for bad in (float("inf"), float("-inf"), float("nan")):
        y = x.clone()
        y[7, k - 1] = bad
        assert nq.x16_rows(y) is None


def test_int8_route_writes_bf16_exactly_as_torch_rounds_its_float32(rd, nq):
    """The int16-lhs route writing bf16 itself (every product on the route, no float32 copy) gives the float32
    output rounded by torch, bit for bit, over groups of 1..16 rows, K past one int32 span, N short of a group of 4."""
    _require_x16_route(nq)
    g = torch.Generator().manual_seed(5)
    sizes = [1, 16, 5, 2, 7]
    k, n = 1100, 139
    q, s = operands(rd, "int8", len(sizes), k, n)
    w, scale = q.transpose(1, 2), s.contiguous()  # [G, N, K] bytes, [G, 1, N]
    x = nq.x16_rows(torch.randn(sum(sizes), k, generator=g).to(torch.bfloat16))
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    items = torch.tensor([(e, a, m) for e, (a, m) in enumerate(zip(starts, sizes, strict=True))], dtype=torch.int64)
    f32 = torch.empty(sum(sizes), n)
    bf16 = torch.empty(sum(sizes), n, dtype=torch.bfloat16)
    nq.grouped_x16(x, w, scale, f32, items, torch.zeros(1, dtype=torch.int32))
    nq.grouped_x16(x, w, scale, bf16, items, torch.zeros(1, dtype=torch.int32))
    assert bool(torch.isfinite(f32).all()) and float(f32.abs().max()) > 0
    assert torch.equal(bf16.view(torch.int16), f32.to(torch.bfloat16).view(torch.int16))


@pytest.mark.parametrize("sizes", [[3, 0, 5, 1], [2, 20, 1]], ids=["every_group_on_the_route", "a_group_past_it"])
def test_gathered_rows_equal_the_gather_done_first(rd, nq, sizes):
    """grouped_matmul_quantized(lhs, ..., rows=idx) (the routed gather folded into the int16-lhs route's pass) equals
    the product of lhs[idx] bit for bit, whether every group takes the route or one runs past MAX_ROWS; an index out
    of range is an IndexError, not a read outside lhs."""
    _require_x16_route(nq)
    quant = _module(rd, "torch_cpu.quantized_ragged_dot")
    q, s = operands(rd, "int8", len(sizes), 300, 72)
    g = torch.Generator().manual_seed(3)
    lhs = torch.randn(7, 300, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 7, (sum(sizes),), generator=g)
    got = quant.grouped_matmul_quantized(lhs, q, s, sizes, rows=idx)
    want = quant.grouped_matmul_quantized(lhs[idx].contiguous(), q, s, sizes)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert bool(torch.isfinite(got).all()) and float(got.abs().max()) > 0
    with pytest.raises(IndexError):
        nq.x16_rows(lhs, torch.tensor([0, 7]))
