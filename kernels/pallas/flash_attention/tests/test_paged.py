"""Ragged paged attention against the float64 NumPy reference: every implementation on random and edge cases, the
cache update row by row, bad page tables (a clear error when concrete, clamped reads and dropped writes under jit)."""

from __future__ import annotations

import dataclasses

import flash_attention as fa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flash_attention.paged_cases import SMALL, PagedScenario, features, flat, paged_inputs
from jax.experimental.pallas import tpu as pltpu

from kernel_hub.verify.numerics import relative_error, tolerance

ARGS = ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")

#: Beside SMALL (one token, a page boundary, a full page, an empty sequence, an empty slot, padding rows, sequences
#: longer than the window, MQA with soft cap and sinks, MHA non-causal): GQA with 4 kv heads mixing prefill and
#: decode, and every feature at once.
EDGE = (
    PagedScenario("mixed_prefill_decode_gqa4", ((1, 40), (17, 17), (1, 9), (6, 30)), hq=8, hkv=4, d=128,
                  page_size=16, pages_per_seq=3),
    PagedScenario("softcap_sinks_window", ((7, 20), (1, 33)), hq=4, hkv=2, d=128, page_size=16, pages_per_seq=3,
                  window=10, soft_cap=5.0, sinks=True),
)
SCENARIOS = {sc.name: sc for sc in (*SMALL, *EDGE)}


def _run(sc: PagedScenario, dtype: str, seed: int, **kw):
    x = paged_inputs(sc, dtype, seed)
    out = fa.ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **features(sc), **kw)
    ref = fa.reference_ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **features(sc))
    return x, out, ref


def _error(out, ref) -> float:
    return relative_error(flat(*out), flat(*ref))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("impl", ["cpu", "pallas"])
def test_matches_float64_reference(name: str, impl: str) -> None:
    sc = SCENARIOS[name]
    for i, dtype in enumerate(("float32", "bfloat16")):
        both = name in ("mixed_prefill_decode_gqa4", "decode_mqa_softcap_sinks") and impl == "cpu"
        if not both and i != len(name) % 2:
            continue  # one dtype per scenario, alternating, keeps the run short (bf16 and f32 both covered)
        _, out, ref = _run(sc, dtype, seed=7 + i, implementation=impl)
        err = _error(out, ref)
        assert np.isfinite(np.asarray(out[0], np.float32)).all()
        assert err <= tolerance(dtype), f"{name} {impl} {dtype}: {err}"
        assert fa.last_implementation()[0] == impl


def test_xla_gather_path_matches() -> None:
    _, out, ref = _run(SCENARIOS["softcap_sinks_window"], "float32", seed=3, implementation="xla")
    assert _error(out, ref) <= tolerance("float32")


def test_default_on_cpu_is_the_page_walk() -> None:
    _run(SCENARIOS["decode_mqa_softcap_sinks"], "float32", seed=0)
    name, why = fa.last_implementation()
    assert name == "cpu" and "default order for cpu" in why


@pytest.mark.parametrize("impl", ["cpu", "pallas"])
def test_cache_update_writes_exactly_the_new_rows(impl: str) -> None:
    sc = SCENARIOS["mixed_prefill_decode_gqa4"]
    x, (_, kc, vc), _ = _run(sc, "bfloat16", seed=11, implementation=impl)  # bf16: the interpreted kernel is reused
    k0, v0, kn, vn = (np.asarray(x[k], np.float32) for k in ("k_cache", "v_cache", "keys", "values"))
    kc, vc = np.asarray(kc, np.float32), np.asarray(vc, np.float32)
    written = np.zeros(k0.shape[:2], bool)
    for i, (q_len, kv_len) in enumerate(sc.seqs):
        start = int(x["cu_q_lens"][i])
        for j in range(q_len):
            pos = kv_len - q_len + j
            page, slot = x["page_indices"][i, pos // sc.page_size], pos % sc.page_size
            np.testing.assert_array_equal(kc[page, slot], kn[start + j])
            np.testing.assert_array_equal(vc[page, slot], vn[start + j])
            written[page, slot] = True
    assert written.sum() == sum(q for q, _ in sc.seqs)
    np.testing.assert_array_equal(kc[~written], k0[~written])
    np.testing.assert_array_equal(vc[~written], v0[~written])


def _bad(change):
    sc = SCENARIOS["softcap_sinks_window"]
    x = paged_inputs(sc, "float32", 0)
    change(x)
    return x


BAD = {
    "page id outside the cache": (lambda x: x["page_indices"].__setitem__((0, 1), 99), "outside the cache"),
    "negative page id": (lambda x: x["page_indices"].__setitem__((1, 0), -1), "outside the cache"),
    "kv_lens past the pages": (lambda x: x["kv_lens"].__setitem__(1, 49), "past the 3 pages"),
    "more new tokens than kv_len": (lambda x: x["kv_lens"].__setitem__(0, 6), "new tokens"),
    "cu_q_lens decreasing": (lambda x: x["cu_q_lens"].__setitem__(1, 9), "never decrease"),
    "cu_q_lens past the tokens": (lambda x: x["cu_q_lens"].__setitem__(2, 40), "past the 8 query rows"),
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_bad_metadata_is_one_clear_error(what: str) -> None:
    change, words = BAD[what]
    x = _bad(change)
    with pytest.raises(ValueError, match=words):
        fa.ragged_paged_attention(*(x[k] for k in ARGS))


def test_bad_shapes_name_the_argument() -> None:
    x = paged_inputs(SCENARIOS["softcap_sinks_window"], "float32", 0)
    with pytest.raises(ValueError, match="cu_q_lens must be"):
        fa.ragged_paged_attention(*(x[k] for k in ARGS[:7]), x["cu_q_lens"][:-1])
    with pytest.raises(ValueError, match="num_seqs must be in"):
        fa.ragged_paged_attention(*(x[k] for k in ARGS[:8]), 3)


@pytest.mark.parametrize("impl", ["cpu", "pallas"])
def test_traced_bad_table_never_leaves_the_cache(impl: str) -> None:
    """Under jit the same bad table gives no error: reads are clamped into the cache (the TPU simulator raises on
    any out-of-bounds read) and writes aimed at a page outside it are dropped."""
    sc = dataclasses.replace(SCENARIOS["mixed_prefill_decode_gqa4"], spare_pages=0)
    x = paged_inputs(sc, "float32", 5)
    x["page_indices"][3, 1] = 10_000  # sequence 3 writes positions 24..29: 24..29 land on this page
    x["page_indices"][0, 0] = -7  # read only
    x["kv_lens"][2] = 10_000  # past its pages: clipped to 48
    interpret = pltpu.InterpretParams(out_of_bounds_reads="raise") if impl == "pallas" else None
    call = jax.jit(lambda *a: fa.ragged_paged_attention(*a, implementation=impl, interpret=interpret))
    out, kc, _ = call(*(x[k] for k in ARGS))
    assert np.isfinite(np.asarray(out)).all()
    k0, kc, keys = np.asarray(x["k_cache"]), np.asarray(kc), np.asarray(x["keys"])
    changed = (kc != k0).any(axis=(-2, -1))
    # 25 new tokens; sequence 3's 6 (on the page outside the cache) are dropped
    assert changed.sum() == 19
    for row in kc[changed]:
        assert (keys == row).all(axis=(-2, -1)).any()


def test_cpu_path_never_gathers_the_whole_cache() -> None:
    """Peak temporary memory of the compiled CPU path stays below one copy of the cache; the gather baseline's
    exceeds it (XLA's own memory analysis of the compiled call)."""
    sc = PagedScenario("decode_32x512", tuple((1, 512) for _ in range(32)), hq=8, hkv=2, d=128, page_size=16,
                       pages_per_seq=32, spare_pages=0)
    x = paged_inputs(sc, "float32", 0)
    cache_bytes = np.asarray(x["k_cache"]).nbytes
    cfg = fa.AttentionConfig(paged_pages_per_block=4)
    temps = {}
    for impl in ("cpu", "xla"):
        fn = jax.jit(lambda *a, i=impl: fa.ragged_paged_attention(*a, implementation=i, config=cfg))
        args = [jnp.asarray(x[k]) for k in ARGS]
        temps[impl] = fn.lower(*args).compile().memory_analysis().temp_size_in_bytes
    assert temps["cpu"] < cache_bytes / 2, temps
    assert temps["xla"] >= cache_bytes, temps


#: A window that starts mid-page and mid-block, several kv steps per item (2 pages per step), a prefill chunk crossing
#: pages beside decode steps far past the window, and a sequence shorter than the window.
WINDOWED = PagedScenario("window_unaligned", ((1, 100), (9, 70), (1, 17), (3, 53)), hq=4, hkv=2, d=128,
                         page_size=16, pages_per_seq=7, window=21)


@pytest.mark.parametrize("impl", ["cpu", "pallas"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_window_reads_from_its_first_page_matches_reference(impl: str, dtype: str) -> None:
    cfg = fa.AttentionConfig(paged_pages_per_block=2, paged_block_q=4)
    _, out, ref = _run(WINDOWED, dtype, seed=31, implementation=impl, config=cfg)
    assert np.isfinite(np.asarray(out[0], np.float32)).all()
    assert _error(out, ref) <= tolerance(dtype)


def test_a_windowed_layer_walks_only_the_blocks_its_window_spans() -> None:
    """Gemma 4's sliding layers at decode: 8192 positions, window 1024, pages of 128, 8 pages per step: the window
    plus one page of misalignment spans 2 steps where the whole sequence is 8."""
    from flash_attention.paged import _steps
    from flash_attention.paged_checks import PagedShapes

    sh = PagedShapes(64, 16, 8, 256, 4096, 128, 64, 64, 1.0, 1024, None)
    assert _steps(sh, 1, 8) == 2
    assert _steps(dataclasses.replace(sh, window=None), 1, 8) == 8
    assert _steps(dataclasses.replace(sh, window=1), 1, 1) == 1  # one position: one page
    assert _steps(dataclasses.replace(sh, window=129), 16, 1) == 3  # 129 + 15 positions from a page start


#: Decode only (the one-token-per-row schedule that reads queries and writes outputs in place): GQA with 2 query
#: heads per kv head, padding rows, an empty slot, a sequence of one position, one past its window, a page boundary.
DECODE_GQA = PagedScenario("decode_gqa2_window_padding", ((1, 1), (1, 33), (1, 16), (1, 70)), hq=8, hkv=4, d=128,
                           page_size=16, pages_per_seq=5, pad=3, empty_slots=1, window=40, soft_cap=30.0, sinks=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_schedule_in_place_matches_reference(dtype: str) -> None:
    cfg = fa.AttentionConfig(paged_block_q=1)  # padding rows lift the mean tokens per sequence past 1
    _, out, ref = _run(DECODE_GQA, dtype, seed=41, implementation="pallas", config=cfg)
    assert fa.last_tuning().startswith("block_q 1,")  # the decode schedule ran
    got = np.asarray(out[0], np.float32)
    assert np.isfinite(got).all()
    assert (got[-DECODE_GQA.pad:] == 0).all()  # padding rows' output is 0
    assert _error(out, ref) <= tolerance(dtype)
