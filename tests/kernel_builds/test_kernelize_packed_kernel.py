"""The ragged-dot torch entry's packed-weights path (torch_cpu/packed.py): moe_experts_packed against a NumPy float64
reference and bit for bit against moe_experts, and pack_experts' in-place contract (refusals leave the weight as it
was, a failure part way is rolled back, unpack and pickling give the dense bytes back); small row counts padded for
oneDNN's blocked kernels stay bit-identical to the unpacked loop; packed bytes collapsed into 2 MiB pages keep their
values and report what the page tables say."""

from __future__ import annotations

import pickle
import sys
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kernel_hub.layers.kinds.experts.packing import _pages  # noqa: E402
from kernel_hub.verify.numerics import TOLERANCE, relative_error  # noqa: E402

MIB = 1 << 20


@pytest.fixture(scope="module")
def rd(rd):
    """The shared ragged dot (tests/conftest.py), where this CPU packs expert weights."""
    for dtype in (torch.float32, torch.bfloat16):
        ok, why = rd.packing_support(dtype)
        if not ok:
            pytest.skip(f"oneDNN packing unavailable here: {why}")
    return rd


def refused_without_onednn(rd, weight: torch.Tensor, transposed: bool = True) -> bool:
    """Where oneDNN cannot pack `weight`'s dtype on this CPU (bfloat16 without AVX512 or AMX), assert that
    pack_experts refuses it with one PackingError naming oneDNN and leaves it as it was, and return True; else False
    (the caller then checks the packed route itself)."""
    import sys

    ok, why = sys.modules[rd.PackedExperts.__module__].onednn_support(weight.dtype)
    if ok:
        return False
    original = weight.clone()
    with pytest.raises(rd.PackingError, match="oneDNN cannot pack"):
        rd.pack_experts(weight, transposed=transposed)
    assert torch.equal(weight, original) and why
    return True


def reference_moe(hidden, index, weights, up, down, *, transposed, concatenated, gated, up_bias=None, down_bias=None):
    """Mixture of experts in float64 NumPy, token by token (ids >= E are dropped)."""
    h = hidden.double().numpy()
    w_up = up.double().numpy()
    w_down = down.double().numpy()
    if not transposed:
        w_up, w_down = w_up.transpose(0, 2, 1), w_down.transpose(0, 2, 1)  # [E, H, 2I], [E, I, H]
    num_experts = w_up.shape[0]
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        for k in range(index.shape[1]):
            e = int(index[t, k])
            if e >= num_experts:
                continue
            a = h[t] @ w_up[e]
            if up_bias is not None:
                a = a + up_bias[e].double().numpy()
            if gated:
                g, u = (a[: a.size // 2], a[a.size // 2:]) if concatenated else (a[0::2], a[1::2])
                a = g / (1.0 + np.exp(-g)) * u
            else:
                a = a / (1.0 + np.exp(-a))
            o = a @ w_down[e]
            if down_bias is not None:
                o = o + down_bias[e].double().numpy()
            out[t] += float(weights[t, k]) * o
    return out


def routes(kind, tokens, num_experts, top_k, g):
    if kind == "random":
        return torch.argsort(torch.rand(tokens, num_experts, generator=g), dim=1)[:, :top_k]
    if kind == "one_expert_holds_all":  # every token's first choice is expert 3, the rest leave most experts empty
        index = torch.full((tokens, top_k), 3)
        index[:, 1:] = 5 + torch.arange(top_k - 1)
        return index
    if kind == "sentinels":  # ids >= E (expert-parallel drops) mixed in
        index = torch.argsort(torch.rand(tokens, num_experts, generator=g), dim=1)[:, :top_k]
        index[::3, -1] = num_experts + 2
        return index
    raise ValueError(kind)


CASES = [  # (transposed, concatenated, gated, bias)
    (False, True, True, False),  # Qwen3 / Mixtral
    (True, False, True, True),  # GPT-OSS style: [E, H, 2I], interleaved, biases
    (False, True, False, False),  # ungated up projection
]


@pytest.mark.parametrize("route", ["random", "one_expert_holds_all", "sentinels"])
@pytest.mark.parametrize("layout", CASES, ids=["concat", "transposed_interleaved_bias", "ungated"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_moe_experts_packed_against_float64_and_unpacked(rd, dtype, layout, route):
    transposed, concatenated, gated, bias = layout
    num_experts, hidden_size, inter, top_k, tokens = 8, 64, 64, 3, 37  # 37: not a multiple of any tile
    g = torch.Generator().manual_seed(zlib.crc32(repr((route, layout, str(dtype))).encode()))
    width = 2 * inter if gated else inter
    up_shape = (num_experts, hidden_size, width) if transposed else (num_experts, width, hidden_size)
    down_shape = (num_experts, inter, hidden_size) if transposed else (num_experts, hidden_size, inter)
    up = (torch.randn(up_shape, generator=g) / 8).to(dtype)
    down = (torch.randn(down_shape, generator=g) / 8).to(dtype)
    up_bias = (torch.randn(num_experts, width, generator=g) / 10).to(dtype) if bias else None
    down_bias = (torch.randn(num_experts, hidden_size, generator=g) / 10).to(dtype) if bias else None
    hidden = torch.randn(tokens, hidden_size, generator=g).to(dtype)
    index = routes(route, tokens, num_experts, top_k, g)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1).to(dtype)
    kw = dict(is_concatenated=concatenated, has_gate=gated, gate_up_proj_bias=up_bias, down_proj_bias=down_bias)
    with torch.no_grad():
        unpacked = rd.moe_experts(hidden, index, weights, up, down, is_transposed=transposed, **kw)
    expected = reference_moe(hidden, index, weights, up, down, transposed=transposed, concatenated=concatenated,
                             gated=gated, up_bias=up_bias, down_bias=down_bias)
    if transposed and refused_without_onednn(rd, up):
        return
    original_up, original_down = up.clone(), down.clone()
    packed_up = rd.pack_experts(up, transposed=transposed)
    packed_down = rd.pack_experts(down, transposed=transposed)
    with torch.no_grad():
        got = rd.moe_experts_packed(hidden, index, weights, packed_up, packed_down, **kw)
    assert not torch.isnan(got).any()
    assert relative_error(got, expected) <= TOLERANCE[str(dtype).replace("torch.", "")]
    assert torch.equal(got, unpacked)
    if route == "sentinels":
        assert torch.count_nonzero(got[::3]) > 0  # the dropped slot zeroes only itself
    assert torch.equal(packed_up.unpack(), original_up) and torch.equal(packed_down.unpack(), original_down)


def test_pack_experts_onednn_writes_into_the_weight_and_unpacks_bit_for_bit(rd):
    weight = torch.randn(4, 64, 128).to(torch.bfloat16)  # [E, K, N]: a transposed stack takes oneDNN's layout
    if refused_without_onednn(rd, weight):
        return
    original = weight.clone()
    pointer = weight.data_ptr()
    packed = rd.pack_experts(weight, transposed=True)
    assert packed.tensor is weight and packed.packed and not packed.native and weight.data_ptr() == pointer
    assert not torch.equal(weight, original)  # its bytes now hold the packed layout
    assert torch.equal(packed.dense(), original) and packed.dense().stride() == original.stride()
    x = torch.randn(5, 64).to(torch.bfloat16)
    assert torch.equal(packed.linear(2, x), torch.nn.functional.linear(x, original[2].t()))
    assert packed.unpack() is weight and torch.equal(weight, original) and not packed.packed


def test_pack_experts_native_reads_the_weight_where_it_lies(rd):
    """An nn.Linear-style stack goes to the native rows kernel where it is available: not a byte changes, and its
    products are the unpacked loop's (the bit-for-bit tests above run through it)."""
    import sys

    native = sys.modules[rd.PackedExperts.__module__].native_rows
    ok, why = native.available(torch.bfloat16)
    weight = torch.randn(4, 128, 64).to(torch.bfloat16)
    original = weight.clone()
    packed = rd.pack_experts(weight, transposed=False)
    assert packed.native == ok, why
    if ok:
        assert torch.equal(weight, original) and packed.how == "native rows kernel on the original layout"
        assert all(m.data_ptr() == weight[e].data_ptr() for e, m in enumerate(packed.experts))
    x = torch.randn(5, 64).to(torch.bfloat16)
    got = packed.linear(2, x)
    reference = x.double() @ original[2].double().t()
    assert (got.double() - reference).abs().max() <= 1e-2 * reference.abs().max()
    assert packed.unpack() is weight and torch.equal(weight, original) and not packed.packed


def test_pickled_packed_experts_hold_dense_values_and_pack_again(rd):
    weight = torch.randn(3, 64, 128)
    original = weight.clone()
    packed = rd.pack_experts(weight, transposed=True)
    data = pickle.dumps(packed)
    restored = pickle.loads(data)
    assert restored.packed and restored.transposed
    assert torch.equal(restored.dense(), original) and restored.tensor.data_ptr() != weight.data_ptr()
    assert torch.equal(restored.unpack(), original)


def onednn_layout(rd, matrix: torch.Tensor) -> tuple[int | None, int]:
    """What oneDNN does with this [N, K] matrix on this CPU: the batch hint pack_experts would use (None: no exact
    one) and the packed bytes under it (the blocked layout's padding differs by ISA: AMX keeps 32 bf16 rows as they
    are, AVX512 pads them to 64)."""
    module = sys.modules[rd.PackedExperts.__module__]
    hint, _ = module.exact_hint(matrix)
    if hint is None:
        return None, 0
    return hint, int(torch.ops.mkldnn._nbytes(torch.ops.mkldnn._reorder_linear_weight(matrix, hint)))


CANDIDATE_SHAPES = ((32, 64), (17, 64), (31, 64), (8, 64), (48, 64), (33, 40))  # [N, K] of one bf16 expert


def padded_shape(rd) -> tuple[int, int]:
    """The first candidate [N, K] that oneDNN, asked on this CPU, packs into more bytes than the dense matrix."""
    torch.manual_seed(0)
    for rows, cols in CANDIDATE_SHAPES:
        matrix = torch.randn(rows, cols).to(torch.bfloat16)
        hint, nbytes = onednn_layout(rd, matrix)
        if hint is not None and nbytes != matrix.numel() * matrix.element_size():
            return rows, cols
    raise AssertionError(f"oneDNN pads none of {CANDIDATE_SHAPES} bf16 on this CPU: no shape to test the refusal")


@pytest.mark.parametrize("rows,cols", CANDIDATE_SHAPES)
def test_pack_experts_in_place_follows_onednns_layout(rd, rows, cols):
    """Whatever oneDNN's layout on this CPU: a shape it packs into the dense bytes packs in place and unpacks to
    the same values; one it pads is refused with the weight untouched."""
    torch.manual_seed(0)
    weight = torch.randn(3, cols, rows).to(torch.bfloat16)  # transposed [E, K, N]: oneDNN's route
    if refused_without_onednn(rd, weight):
        return
    original = weight.clone()
    hint, nbytes = onednn_layout(rd, weight[0].t())
    dense_bytes = weight[0].numel() * weight.element_size()
    if hint is None:
        with pytest.raises(rd.PackingError, match="bit-identical"):
            rd.pack_experts(weight, transposed=True)
    elif nbytes != dense_bytes:
        with pytest.raises(rd.PackingError, match="in place"):
            rd.pack_experts(weight, transposed=True)
    else:
        packed = rd.pack_experts(weight, transposed=True)
        assert packed.packed and torch.equal(packed.dense(), original)
        assert torch.equal(packed.unpack(), original)
    assert torch.equal(weight, original)


@pytest.mark.parametrize("case", ["shared", "not_contiguous", "requires_grad", "two_dims", "float16", "padded"])
def test_pack_experts_refusals_leave_the_weight_as_it_was(rd, case):
    weight = torch.randn(4, 64, 64)
    other = None
    if case == "shared":
        other = weight[1]  # a view someone holds
    elif case == "not_contiguous":
        weight = torch.randn(4, 64, 64).transpose(1, 2)
    elif case == "requires_grad":
        weight = torch.nn.Parameter(weight)
    elif case == "two_dims":
        weight = torch.randn(64, 64)
    elif case == "float16":
        weight = weight.half()
    elif case == "padded":  # a shape oneDNN pads on this CPU (asked, not assumed: AMX and AVX512 differ)
        if refused_without_onednn(rd, torch.randn(4, 64, 64).to(torch.bfloat16)):
            return
        rows, cols = padded_shape(rd)
        weight = torch.randn(4, cols, rows).to(torch.bfloat16)  # transposed [E, K, N]: oneDNN's route
    original = weight.detach().clone()
    words = {"shared": "shared with another tensor", "not_contiguous": "not contiguous",
             "requires_grad": "requires grad", "two_dims": "3-D", "float16": "3-D", "padded": "in place"}[case]
    with pytest.raises(rd.PackingError, match=words):
        rd.pack_experts(weight, transposed=case == "padded")
    assert torch.equal(weight.detach(), original)
    if other is not None:
        assert torch.equal(other, original[1])


def test_a_failure_part_way_unpacks_what_was_packed(rd, monkeypatch):
    import sys

    packed_module = sys.modules[rd.PackedExperts.__module__]
    api, _ = packed_module._blob_api()
    real = api.view
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated failure at the third expert")
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "view", failing)
    weight = torch.randn(5, 64, 64)
    original = weight.clone()
    with pytest.raises(RuntimeError, match="third expert"):
        rd.pack_experts(weight, transposed=True)  # oneDNN's route writes expert by expert
    assert len(calls) == 3 and torch.equal(weight, original)


def test_packing_support_reasons(rd):
    ok, why = rd.packing_support(torch.float16)
    assert not ok and "float16" in why
    import sys

    onednn_support = sys.modules[rd.PackedExperts.__module__].onednn_support
    for dtype in (torch.float32, torch.bfloat16):
        ok, why = rd.packing_support(dtype)
        assert ok and ("probe passed" in why or "self-test passed" in why)  # oneDNN's probe or the native kernel's
        onednn, onednn_why = onednn_support(dtype)
        assert ("probe passed" in onednn_why) if onednn else ("not supported on this CPU" in onednn_why)
        assert (onednn_why in why) == onednn  # packing_support names oneDNN only where it packs


def test_moe_experts_packed_refuses_inputs_that_need_grad(rd):
    up = torch.randn(2, 128, 64)
    down = torch.randn(2, 64, 64)
    packed_up, packed_down = rd.pack_experts(up, transposed=False), rd.pack_experts(down, transposed=False)
    hidden = torch.randn(3, 64, requires_grad=True)
    with pytest.raises(RuntimeError, match="inference-only"):
        rd.moe_experts_packed(hidden, torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1), packed_up,
                                  packed_down)


# --- small row counts padded for oneDNN's blocked kernels; packed bytes in 2 MiB pages ---------------------------


@pytest.fixture(scope="module")
def pages(rd):
    """The kernel's huge_pages module (the package is imported under a private name by the verified loader)."""
    return sys.modules[rd.advise_huge_pages.__module__]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_every_small_row_count_is_bit_identical_packed_and_unpacked(rd, dtype):
    """Rows 1-9 through the packed linear (padded to the blocked kernels' row count where fewer) equal the unpacked
    grouped loop bit for bit. K = 2048 makes sums long enough that a different kernel shows in the last bits: before
    the unpacked bfloat16 path took the same padded route, one row differed from torch.mm's one-row kernel in about
    one trial of eight at this size."""
    g = torch.Generator().manual_seed(11)
    experts, n, k = 3, 1024, 2048
    weight = (torch.randn(experts, n, k, generator=g) * 0.02).to(dtype)
    rhs = weight.clone().transpose(1, 2)  # [E, K, N]: the unpacked loop's view of nn.Linear weights
    packed = rd.pack_experts(weight, transposed=False)
    try:
        for trial in range(4):
            for rows in range(1, 10):
                x = torch.randn(rows, k, generator=g).to(dtype)
                for e in range(experts):
                    sizes = torch.zeros(experts, dtype=torch.int32)
                    sizes[e] = rows
                    with torch.no_grad():
                        unpacked = rd.ragged_dot(x, rhs, sizes)
                    got = packed.linear(e, x)
                    assert got.shape == (rows, n) and not torch.isnan(got).any()
                    assert torch.equal(got, unpacked), f"trial {trial}, {rows} rows, expert {e}"
                    reference = x.double() @ rhs[e].double()
                    assert (got.double() - reference).abs().max() <= 0.02 * reference.abs().max()
    finally:
        packed.unpack()


def test_aligned_interior_by_hand(pages):
    two = 2 * MIB
    assert pages.aligned_interior(3 * two + 5, 5 * two) == (4 * two, 4 * two)  # partial first and last pages left out
    assert pages.aligned_interior(4 * two, 3 * two) == (4 * two, 3 * two)  # already aligned: all of it
    assert pages.aligned_interior(4 * two + 1, two) == (5 * two, 0)  # less than one whole page inside
    assert pages.aligned_interior(0, 0) == (0, 0)


def test_thp_mode_reads_the_bracketed_choice(pages, tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert pages.thp_mode(f) == "madvise"
    f.write_text("[never] madvise always\n")
    assert pages.thp_mode(f) == "never"
    f.write_text("garbled\n")
    assert pages.thp_mode(f) is None
    assert pages.thp_mode(tmp_path / "missing") is None


def test_huge_pages_keep_the_values_and_report_what_the_kernel_did(pages, monkeypatch):
    t = torch.randn(5 * MIB)  # 20 MiB of float32: several whole 2 MiB pages inside, wherever it lands
    original = t.clone()
    nbytes, why = pages.advise_huge_pages(t)
    assert torch.equal(t, original)
    _, length = pages.aligned_interior(t.data_ptr(), t.numel() * t.element_size())
    if nbytes:
        assert nbytes == length and why == f"{length >> 20} MiB in 2 MiB pages"
        seen = pages.huge_bytes(t)
        assert seen is None or seen >= nbytes  # the kernel's own count of huge pages under the tensor
    else:
        assert why.startswith("ordinary pages (") and why.endswith(")")
    if sys.platform.startswith("linux") and pages.thp_mode() in ("always", "madvise"):
        assert nbytes or "madvise(" in why  # here huge pages are on offer: a refusal must name the call that refused
    monkeypatch.setenv(pages.ENV, "0")
    assert pages.advise_huge_pages(torch.randn(5 * MIB)) == (0, f"ordinary pages ({pages.ENV}=0)")


def test_the_packed_reason_sums_huge_pages_or_says_why_not():
    huge = SimpleNamespace(huge_pages=(6 * MIB, "6 MiB in 2 MiB pages"))
    other = SimpleNamespace(huge_pages=(4 * MIB, "4 MiB in 2 MiB pages"))
    refused = SimpleNamespace(huge_pages=(0, "ordinary pages (madvise(MADV_COLLAPSE): Resource temporarily "
                                             "unavailable)"))
    assert _pages([huge, other]) == "10 MiB in 2 MiB pages"
    assert _pages([huge, refused]) == refused.huge_pages[1]
    assert _pages([SimpleNamespace()]) == "ordinary pages"  # a kernel that predates huge pages


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_combine_split_over_workers_equals_one_pass(rd, dtype, monkeypatch):
    """The block's last step splits tokens over the workers on CPU inference; autograd and one worker run it in one
    pass. Both give the same bits, and both match float64 (sentinel rows dropped)."""
    cpu = sys.modules[rd.combine_experts.__module__]
    g = torch.Generator().manual_seed(9)
    tokens, top_k, experts, hidden = 37, 4, 6, 48
    index = torch.argsort(torch.rand(tokens, experts + 2, generator=g), dim=1)[:, :top_k]  # ids 6, 7: sentinels
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1).to(dtype)
    routing = cpu.route(index, experts)
    rows = torch.randn(tokens * top_k, hidden, generator=g).to(dtype)
    rows[~routing.in_range] = float("nan")  # what a dropped row holds must never reach a token
    args = (rows, weights, routing.perm, routing.in_range, tokens, top_k, dtype)
    monkeypatch.setenv("KERNEL_HUB_CPU_WORKERS", "2")
    with torch.no_grad():
        split = cpu.combine_experts(*args)
    monkeypatch.setenv("KERNEL_HUB_CPU_WORKERS", "1")
    with torch.no_grad():
        whole = cpu.combine_experts(*args)
    assert torch.equal(split, whole) and not torch.isnan(split).any()
    expected = np.zeros((tokens, hidden))
    flat = index.reshape(-1)
    for slot in range(tokens * top_k):
        if flat[slot] < experts:
            row = int((routing.perm == slot).nonzero())
            expected[slot // top_k] += float(weights.reshape(-1)[slot]) * rows[row].double().numpy()
    assert relative_error(split, expected) <= TOLERANCE[str(dtype).replace("torch.", "")]
