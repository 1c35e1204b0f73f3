"""Odd and hostile inputs of the JAX paged entries (`ragged_paged_attention`, every implementation, and the RPA v3
face): int64 metadata is checked in int64 (a page id of 2**32 + 1 never reads or writes page 1), soft caps must be
finite and positive, num_seqs an integer, a v3 distribution three ordered integers, two new tokens never share one
page slot; a window wider than any sequence, int64 metadata in range and a zero-token call still match the float64
NumPy reference (or give zeros with the caches unchanged)."""

from __future__ import annotations

import flash_attention as fa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flash_attention.paged_cases import PagedScenario, features, flat, paged_inputs
from flash_attention.paged_checks import as_int32
from flash_attention.paged_v3 import fuse_kv_cache, ragged_paged_attention_v3

from kernel_hub.verify.numerics import relative_error, tolerance

ARGS = ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")
SC = PagedScenario("mixed", ((3, 20), (1, 17), (5, 5)), hq=4, hkv=2, d=128, page_size=16, pages_per_seq=2,
                   window=None)
IMPLS = ("cpu", "xla", "pallas")


def _inputs(dtype="float32", seed=0, sc=SC):
    return paged_inputs(sc, dtype, seed)


def _call(x, **kw):
    return fa.ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **kw)


def _reference(x, sc=SC, **kw):
    return fa.reference_ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **{**features(sc), **kw})


def _wide(x, name, add=2**32):
    """x[name] as int64 with 2**32 added to its first entry the call reads."""
    a = np.asarray(x[name]).astype(np.int64)
    a[(0, 0) if a.ndim == 2 else (1 if name == "cu_q_lens" else 0)] += add
    return a


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name,words", [("page_indices", r"page_indices\[0, 0\] = 4294967\d{3} is outside"),
                                        ("kv_lens", r"kv_lens\[0\] = 4294967\d{3} is past"),
                                        ("cu_q_lens", r"cu_q_lens must start at >= 0 and never decrease|past the")])
def test_int64_metadata_past_int32_is_refused_not_wrapped(impl, name, words):
    x = _inputs()
    x[name] = _wide(x, name)
    with pytest.raises(ValueError, match=words):
        _call(x, implementation=impl)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int64_metadata_in_range_matches_the_reference(dtype):
    x = _inputs(dtype, seed=3)
    for k in ("kv_lens", "page_indices", "cu_q_lens"):
        x[k] = np.asarray(x[k]).astype(np.int64)
    x["num_seqs"] = np.int64(x["num_seqs"])
    out = _call(x, implementation="cpu")
    err = relative_error(flat(*out), flat(*_reference(x)))
    assert np.isfinite(np.asarray(out[0], np.float32)).all() and err <= tolerance(dtype), err


def test_wider_integers_saturate_into_int32_never_wrap():
    """What the implementations' clamps see for metadata they cannot check (traced): out of range stays out."""
    a = np.array([2**32 + 1, -(2**40), 7], np.int64)
    assert as_int32(a).tolist() == [2**31 - 1, -(2**31), 7]
    u = jnp.asarray(np.array([2**32 - 1, 5], np.uint32))
    assert as_int32(u).tolist() == [2**31 - 1, 5]
    traced = jax.jit(as_int32)(jnp.asarray(np.array([2**31 + 5, 3], np.uint32)))
    assert traced.tolist() == [2**31 - 1, 3]


def test_int64_v3_page_table_is_refused_not_wrapped():
    x = _inputs()
    kv = fuse_kv_cache(x["k_cache"], x["v_cache"], jnp.zeros((SC.num_pages, SC.page_size, 2 * SC.hkv, 1, SC.d),
                                                               jnp.float32))
    table = _wide(x, "page_indices").reshape(-1)
    with pytest.raises(ValueError, match=r"page_indices\[0, 0\] = 4294967\d{3} is outside"):
        ragged_paged_attention_v3(x["queries"], x["keys"], x["values"], kv, x["kv_lens"], table, x["cu_q_lens"],
                                  np.array([0, 0, 3], np.int32), sm_scale=SC.d ** -0.5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_v3_face_matches_the_reference_and_checks_its_distribution(dtype):
    x = _inputs(dtype, seed=5)
    like = jnp.zeros((SC.num_pages, SC.page_size, 2 * SC.hkv, 1, SC.d), dtype)
    kv = fuse_kv_cache(x["k_cache"], x["v_cache"], like)
    args = (x["queries"], x["keys"], x["values"], kv, x["kv_lens"], x["page_indices"].reshape(-1), x["cu_q_lens"])
    out, kv_new = ragged_paged_attention_v3(*args, np.array([1, 2, 3], np.int32), sm_scale=SC.d ** -0.5,
                                            implementation="cpu")
    ref_out, ref_k, ref_v = _reference(x, sm_scale=SC.d ** -0.5)
    assert relative_error(flat(out, kv_new, kv_new[:0]), flat(ref_out, fuse_kv_cache(ref_k, ref_v, like),
                                                             kv_new[:0])) <= tolerance(dtype)
    for bad, words in (([1, 2], "three integers"), ([0, 0, 2.0], "three integers"), ([2, 1, 3], "0 <= decode end"),
                       ([0, 0, 4], "<= 3"), ([-1, 0, 3], "0 <= decode end")):
        with pytest.raises(ValueError, match=words):
            ragged_paged_attention_v3(*args, np.asarray(bad), sm_scale=1.0, implementation="cpu")


@pytest.mark.parametrize("cap", [float("inf"), float("nan"), -2.0, 0.0])
def test_soft_cap_must_be_finite_and_positive(cap):
    x = _inputs()
    with pytest.raises(ValueError, match="soft_cap must be a finite number > 0"):
        _call(x, soft_cap=cap)


@pytest.mark.parametrize("num_seqs", [float("nan"), 2.5, True, "3", 4, -1])
def test_num_seqs_must_be_an_integer_in_range(num_seqs):
    x = _inputs()
    x["num_seqs"] = num_seqs
    with pytest.raises(ValueError, match="num_seqs must be"):
        _call(x)


@pytest.mark.parametrize("impl", ["cpu", "pallas"])
def test_window_wider_than_any_sequence_is_no_window(impl):
    x = _inputs("bfloat16", seed=9)
    out = _call(x, sliding_window=2**40, implementation=impl)
    assert relative_error(flat(*out), flat(*_reference(x))) <= tolerance("bfloat16")
    with pytest.raises(ValueError, match="sliding_window must be an integer"):
        _call(x, sliding_window=2.5)


@pytest.mark.parametrize("impl", IMPLS)
def test_zero_tokens_or_zero_sequences_give_zeros_and_keep_the_caches(impl):
    x = _inputs(seed=2)
    empty = dict(x, queries=x["queries"][:0], keys=x["keys"][:0], values=x["values"][:0],
                 cu_q_lens=np.zeros_like(x["cu_q_lens"]), kv_lens=np.zeros_like(x["kv_lens"]))
    out, kc, vc = _call(empty, implementation=impl)
    assert out.shape == (0, SC.hq, SC.d)
    assert np.array_equal(np.asarray(kc), np.asarray(x["k_cache"]))
    none = dict(x, num_seqs=0)
    out, kc, vc = _call(none, implementation=impl)
    assert out.shape == x["queries"].shape and not np.asarray(out).any()
    assert np.array_equal(np.asarray(vc), np.asarray(x["v_cache"]))


def test_float_lengths_and_mixed_cache_dtypes_are_refused():
    x = _inputs()
    with pytest.raises(ValueError, match="kv_lens must be an integer array"):
        _call(dict(x, kv_lens=x["kv_lens"].astype(np.float32)))
    with pytest.raises(ValueError, match="share one dtype"):
        _call(dict(x, v_cache=x["v_cache"].astype(jnp.bfloat16)))


def test_two_sequences_writing_one_page_slot_are_refused():
    x = _inputs()
    # sequence 1 writes position 16 (its page column 1, row 0); sequence 2 writes positions 0..4 of its first page
    x["page_indices"][2, 0] = x["page_indices"][1, 1]
    k0 = np.asarray(x["k_cache"]).copy()
    with pytest.raises(ValueError, match=r"sequences 1 and 2 both write page \d+ row 0"):
        _call(x)
    assert np.array_equal(np.asarray(x["k_cache"]), k0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_page_shared_for_reading_is_fine(dtype):
    """A common prefix: sequences 0 and 1 read one full page, and each writes only its own pages."""
    sc = PagedScenario("prefix", ((2, 20), (1, 17)), hq=4, hkv=1, d=128, page_size=16, pages_per_seq=2)
    x = _inputs(dtype, seed=4, sc=sc)
    x["page_indices"][1, 0] = x["page_indices"][0, 0]
    out = _call(x, implementation="cpu")
    assert relative_error(flat(*out), flat(*_reference(x, sc=sc))) <= tolerance(dtype)
