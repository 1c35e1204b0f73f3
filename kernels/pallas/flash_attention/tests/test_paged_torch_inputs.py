"""Odd and hostile inputs of the torch builds' paged entries (`ragged_paged_attention`, `flash_attn_with_kvcache`,
`flash_attn_varlen_func(block_table=)`), and the bounded page walk: int64 lengths, offsets and page ids are checked
as int64 (never cut to int32), soft caps finite and positive (flash-attn's 0 = none), float lengths, a non-integer
num_seqs, two new tokens on one page slot, K/V caches of two dtypes and fp8 caches refused with nothing written; a
zero-token call gives an empty output; the walk's work groups stay within their budget and still match the float64
reference (test_paged_torch.py's, over contiguous histories), windowed and not, bf16 and f32."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

import pytest
from test_paged_torch import build, expected

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

torch = pytest.importorskip("torch")

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])


@pytest.fixture(scope="module")
def fa():
    import kernel_hub as kh

    return kh.get_local_kernel(Path(__file__).resolve().parents[1], framework="torch", backend="cpu")


@pytest.fixture(scope="module")
def paged(fa):
    return import_module(fa.__name__ + ".torch_paged")


def _rpa(fa, case, **kw):
    args = {"kv_lens": case["kv_lens"], "table": case["table"], "cu": case["cu"], **kw}
    extra = {k: v for k, v in kw.items() if k not in ("kv_lens", "table", "cu")}
    return fa.ragged_paged_attention(case["q"], case["keys"], case["values"], case["k_cache"], case["v_cache"],
                                     args["kv_lens"], args["table"], args["cu"], implementation="torch", **extra)


def _tol(dtype) -> float:
    return TOL[str(dtype).removeprefix("torch.")]


@pytest.mark.parametrize("what", ["table", "kv_lens", "cu"])
def test_int64_metadata_past_int32_is_refused_and_nothing_written(fa, what):
    case = build(4, q_lens=[2, 1], kv_lens=[6, 5], hq=2, hkv=1)
    value = case[what].long().clone()
    if what == "table":
        value[0, 0] += 2**32  # as int32 this would be the same page again
    elif what == "kv_lens":
        value[1] += 2**32
    else:
        value[2] += 2**32
    before = case["k_cache"].clone()
    with pytest.raises(fa.PagedCacheError, match=r"4294967\d{3}"):
        _rpa(fa, case, **{what: value})
    assert torch.equal(case["k_cache"], before)


def test_flash_attn_entries_keep_int64_through_the_checks(fa):
    case = build(6, q_lens=[1, 1], kv_lens=[6, 5], hq=2, hkv=1)
    q, k, v = (case[x][:2, None] for x in ("q", "keys", "values"))
    cached = (case["kv_lens"] - 1).long()
    with pytest.raises(fa.PagedCacheError, match=r"4294967\d{3}"):
        fa.flash_attn_with_kvcache(q, case["k_cache"], case["v_cache"], k, v, cache_seqlens=cached + 2**32,
                                   block_table=case["table"], causal=True)
    table = case["table"].long()
    table[1, 0] += 2**32
    with pytest.raises(fa.PagedCacheError, match=r"page_indices\[1, 0\] = 4294967\d{3}"):
        fa.flash_attn_with_kvcache(q, case["k_cache"], case["v_cache"], k, v, cache_seqlens=cached,
                                   block_table=table, causal=True)
    cu_q = torch.tensor([0, 1, 2 + 2**32])
    for name, kw in (("seqused_k", {"seqused_k": case["kv_lens"].long() + 2**32}),
                     ("cu_seqlens_q", {"seqused_k": case["kv_lens"].long()})):
        with pytest.raises(fa.PagedCacheError, match=r"4294967\d{3}"):
            fa.flash_attn_varlen_func(case["q"][:2], case["k_cache"], case["v_cache"],
                                      cu_q if name == "cu_seqlens_q" else case["cu"][:3], None, 1, 8,
                                      causal=True, block_table=case["table"], **kw)


@DTYPES
def test_int64_metadata_in_range_matches_the_reference(fa, dtype):
    case = build(8, q_lens=[3, 1, 1], kv_lens=[9, 4, 7], hq=4, hkv=2, dtype=dtype)
    out, _, _ = _rpa(fa, case, kv_lens=case["kv_lens"].long(), table=case["table"].long(), cu=case["cu"].long(),
                     num_seqs=torch.tensor(3))
    want = torch.from_numpy(expected(case, scale=16 ** -0.5)).float()
    assert not out.isnan().any() and rel_error(out.float(), want) <= _tol(dtype)


def test_float_lengths_are_refused(fa):
    case = build(6, q_lens=[1, 1], kv_lens=[6, 5], hq=2, hkv=1)
    q, k, v = (case[x][:2, None] for x in ("q", "keys", "values"))
    for cached in ((case["kv_lens"] - 1).float(), 4.0, 4.5):
        with pytest.raises(fa.UnsupportedAttentionCall, match="cache_seqlens"):
            fa.flash_attn_with_kvcache(q, case["k_cache"], case["v_cache"], k, v, cache_seqlens=cached,
                                       block_table=case["table"])
    with pytest.raises(fa.UnsupportedAttentionCall, match="seqused_k of dtype torch.float32"):
        fa.flash_attn_varlen_func(case["q"][:2], case["k_cache"], case["v_cache"], case["cu"][:3], None, 1, 8,
                                  block_table=case["table"], seqused_k=case["kv_lens"].float())
    with pytest.raises(fa.PagedCacheError, match="kv_lens of shape"):
        _rpa(fa, case, kv_lens=case["kv_lens"].float())


@pytest.mark.parametrize("cap", [float("inf"), float("nan"), -2.0])
def test_soft_caps_must_be_finite_and_positive(fa, cap):
    case = build(6, q_lens=[1, 1], kv_lens=[6, 5], hq=2, hkv=1)
    with pytest.raises(fa.PagedCacheError, match="soft_cap must be a finite number > 0"):
        _rpa(fa, case, soft_cap=cap)
    q, k, v = (case[x][:2, None] for x in ("q", "keys", "values"))
    with pytest.raises(fa.UnsupportedAttentionCall, match="softcap must be a finite number > 0, or 0"):
        fa.flash_attn_with_kvcache(q, case["k_cache"], case["v_cache"], k, v, cache_seqlens=case["kv_lens"] - 1,
                                   block_table=case["table"], softcap=cap)
    with pytest.raises(fa.UnsupportedAttentionCall, match="softcap must be"):
        fa.flash_attn_func(q, q[:, :, :1], q[:, :, :1], softcap=cap)


def test_softcap_zero_is_no_cap(fa):
    case = build(12, q_lens=[1, 1], kv_lens=[6, 5], hq=2, hkv=1)
    q, k, v = (case[x][:2, None] for x in ("q", "keys", "values"))
    out = fa.flash_attn_with_kvcache(q, case["k_cache"], case["v_cache"], k, v, cache_seqlens=case["kv_lens"] - 1,
                                     block_table=case["table"], softcap=0.0, causal=True)
    want = torch.from_numpy(expected(dict(case, q=case["q"][:2]), scale=16 ** -0.5)).float()
    assert rel_error(out[:, 0], want) <= TOL["float32"]


@pytest.mark.parametrize("num_seqs", [float("nan"), 2.5, True, 3])
def test_num_seqs_must_be_an_integer_in_range(fa, num_seqs):
    case = build(6, q_lens=[1, 1], kv_lens=[6, 5], hq=2, hkv=1)
    with pytest.raises(fa.PagedCacheError, match="num_seqs must be"):
        _rpa(fa, case, num_seqs=num_seqs)


def test_zero_tokens_give_an_empty_output_and_keep_the_caches(fa):
    case = build(6, q_lens=[1, 1], kv_lens=[6, 5], hq=2, hkv=1)
    before = case["k_cache"].clone()
    empty = dict(case, q=case["q"][:0], keys=case["keys"][:0], values=case["values"][:0])
    out, _, _ = _rpa(fa, empty, kv_lens=torch.zeros(2, dtype=torch.int32), cu=torch.zeros(3, dtype=torch.int32))
    assert out.shape == (0, 2, 16) and torch.equal(case["k_cache"], before)


def test_two_sequences_writing_one_page_slot_are_refused(fa):
    case = build(6, q_lens=[2, 1], kv_lens=[6, 5], hq=2, hkv=1)
    table = case["table"].clone()
    table[1, 1] = table[0, 1]  # sequence 0 writes positions 4, 5 and sequence 1 position 4: page column 1, row 0
    before = case["k_cache"].clone()
    with pytest.raises(fa.PagedCacheError, match=r"sequences 0 and 1 both write page \d+ row 0"):
        _rpa(fa, case, table=table)
    assert torch.equal(case["k_cache"], before)


def test_caches_of_two_dtypes_are_refused(fa):
    case = build(6, q_lens=[1, 1], kv_lens=[6, 5], hq=2, hkv=1)
    with pytest.raises(fa.PagedCacheError, match="share one dtype"):
        fa.ragged_paged_attention(case["q"], case["keys"], case["values"], case["k_cache"],
                                  case["v_cache"].to(torch.bfloat16), case["kv_lens"], case["table"], case["cu"],
                                  implementation="torch")


def test_fp8_caches_are_one_clear_error_and_nothing_written(fa):
    case = build(6, q_lens=[1, 1], kv_lens=[6, 5], hq=2, hkv=1)
    k8, v8 = case["k_cache"].to(torch.float8_e4m3fn), case["v_cache"].to(torch.float8_e4m3fn)
    before = k8.view(torch.uint8).clone()
    with pytest.raises(fa.PagedCacheError, match="float8_e4m3fn caches are not taken.*k_scale"):
        fa.ragged_paged_attention(case["q"], case["keys"], case["values"], k8, v8, case["kv_lens"], case["table"],
                                  case["cu"], implementation="torch")
    assert torch.equal(k8.view(torch.uint8), before)


@DTYPES
def test_window_wider_than_any_sequence_is_no_window(fa, dtype):
    case = build(14, q_lens=[3, 1], kv_lens=[9, 6], hq=2, hkv=1, dtype=dtype)
    out, _, _ = _rpa(fa, case, sliding_window=2**40)
    want = torch.from_numpy(expected(case, scale=16 ** -0.5)).float()
    assert rel_error(out.float(), want) <= _tol(dtype)


def test_plan_work_bounds_a_mixed_batch(paged):
    """One 1024-token prefill chunk beside 255 decode steps (8 heads x 128): no group pads past the budget, every row
    is in exactly one item, and the padded rows stay near the real ones (one group for all would pad 256 x 1024)."""
    q_lens = [1024] + [1] * 255
    row_bytes = 8 * 128 * 4
    groups = paged.plan_work(q_lens, row_bytes, paged.WORK_BYTES)
    seen = sorted((s, r0 + i) for grp in groups for s, r0, n in grp.items for i in range(n))
    assert seen == sorted((s, i) for s, n in enumerate(q_lens) for i in range(n))
    assert all(g.padded_rows() * row_bytes <= paged.WORK_BYTES for g in groups)
    assert sum(g.padded_rows() for g in groups) <= 2 * sum(q_lens)
    small = paged.plan_work(q_lens, row_bytes, 64 * row_bytes)  # a long sequence cut into items of 64 rows
    assert max(g.width for g in small) == 64 and all(g.padded_rows() <= 64 for g in small)


@DTYPES
@pytest.mark.parametrize("opts", [{}, {"window": 5}, {"causal": False}, {"cap": 3.0, "sinks": True}],
                         ids=["causal", "window", "noncausal", "softcap_sinks"])
def test_small_work_groups_match_the_reference(fa, paged, dtype, opts):
    """A budget of a few rows splits the prefill chunks into items and the batch into many groups."""
    q_lens, kv_lens = [9, 1, 1, 4, 1], [13, 7, 1, 4, 22]
    case = build(30, q_lens=q_lens, kv_lens=kv_lens, hq=4, hkv=2, dtype=dtype)
    call = paged.check_paged_call(case["q"], case["k_cache"], case["v_cache"], case["kv_lens"], case["table"],
                                  case["cu"])
    paged.write_new_rows(case["k_cache"], case["v_cache"], case["keys"], case["values"], case["table"], call)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(2)) if opts.get("sinks") else None
    causal = opts.get("causal", True)
    got = paged.paged_attention(case["q"], case["k_cache"], case["v_cache"], case["table"], call, causal=causal,
                                sm_scale=0.25, sliding_window=opts.get("window"), soft_cap=opts.get("cap"),
                                sinks=sinks, work_bytes=3 * 4 * 16 * 4)
    assert len(paged.plan_work(q_lens, 4 * 16 * 4, 3 * 4 * 16 * 4)) > 3
    want = expected(case, causal=causal, window=opts.get("window"), scale=0.25, cap=opts.get("cap"),
                    sinks=None if sinks is None else sinks.numpy())
    assert not got.isnan().any() and rel_error(got.float(), torch.from_numpy(want).float()) <= _tol(dtype)


@DTYPES
def test_flash_attn_with_kvcache_window_matches_the_reference(fa, dtype):
    """The decode fast path with a sliding window (what the packed paged call now passes through)."""
    kv_lens = [6, 13, 1, 9]
    case = build(17, q_lens=[1] * 4, kv_lens=kv_lens, hq=4, hkv=2, dtype=dtype)
    q, k, v = (case[x][:4, None] for x in ("q", "keys", "values"))
    out = fa.flash_attn_with_kvcache(q, case["k_cache"], case["v_cache"], k, v, cache_seqlens=case["kv_lens"] - 1,
                                     block_table=case["table"], softmax_scale=0.3, causal=True, window_size=(3, 3))
    want = torch.from_numpy(expected(dict(case, q=case["q"][:4]), window=4, scale=0.3)).float()
    nowin = torch.from_numpy(expected(dict(case, q=case["q"][:4]), scale=0.3)).float()
    assert rel_error(out[:, 0].float(), want) <= _tol(dtype)
    assert rel_error(out[:, 0].float(), nowin) > 10 * _tol(dtype)  # the window changed the answer
