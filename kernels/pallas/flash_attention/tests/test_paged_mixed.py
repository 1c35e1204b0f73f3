"""The one-call schedule for batches that mix decode steps and prefill chunks: work items read their query rows and
write their output rows where they lie in the packed arrays. Checked against the float64 NumPy reference with chunk
lengths that leave ragged tails of every size (1 to block_q - 1 rows, so every combination of row copies runs), an
empty sequence in the middle, padding rows past cu_q_lens[num_seqs], unused sequence slots, and the features."""

from __future__ import annotations

import flash_attention as fa
import jax
import numpy as np
import pytest
from fa_helpers import kernel_name
from flash_attention.paged_cases import PagedScenario, features, flat, paged_inputs
from jax.extend.core import jaxprs_in_params

from kernel_hub.verify.numerics import relative_error, tolerance

ARGS = ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")

#: (scenario, tokens per work item). Chunks of 13 = 8 + 5, 7 = 4 + 2 + 1 and 6 = 4 + 2 with block_q 8; 9 and 17
#: leave one-token tails (the one-token branch); (0, 5) is a sequence with no new tokens between two others. Items
#: past 32 tokens (pallas_paged.MIXED_SUB_Q) compute in sub-blocks: every count of sub-blocks and partial last ones.
MIXED = (
    (PagedScenario("ragged_gqa4", ((1, 40), (13, 13), (0, 5), (1, 9), (7, 30), (9, 21), (6, 6), (17, 47)),
                   hq=8, hkv=2, d=128, page_size=16, pages_per_seq=3, pad=5, empty_slots=2), 8),
    (PagedScenario("window_softcap_sinks_gqa2", ((7, 20), (1, 33), (11, 40), (0, 3), (1, 1), (5, 16)), hq=4,
                   hkv=2, d=128, page_size=16, pages_per_seq=3, pad=3, window=10, soft_cap=5.0, sinks=True), 4),
    (PagedScenario("noncausal_mha", ((5, 20), (1, 17), (3, 3), (10, 10)), hq=2, hkv=2, d=128, page_size=16,
                   pages_per_seq=2, pad=2, causal=False), 4),
    # fewer tokens in the whole batch than block_q: the queries are padded so every traced row copy fits
    (PagedScenario("fewer_tokens_than_block_q", ((3, 20), (1, 9)), hq=4, hkv=2, d=128, page_size=16,
                   pages_per_seq=2, pad=1), 8),
    # items of up to 128 tokens computed in sub-blocks of 32: chunks of 70 (32 + 32 + 6), 33 (32 + 1), 128 (four
    # whole), 5 (one partial) and 200 (an item of 128, then 72), beside decode steps and a window
    (PagedScenario("sub_blocks_window", ((70, 90), (1, 150), (33, 33), (128, 140), (5, 60), (200, 210)), hq=4,
                   hkv=2, d=128, page_size=16, pages_per_seq=14, pad=2, window=100), 128),
    # block_q 48: sub-blocks of 32 (the second one half past the item's rows), chunks of 47 and 48 and 49
    (PagedScenario("sub_blocks_uneven", ((47, 47), (48, 80), (49, 60), (1, 20)), hq=8, hkv=2, d=128,
                   page_size=16, pages_per_seq=6, pad=1), 48),
)


def _padding_rows(sc: PagedScenario) -> slice:
    return slice(sum(q for q, _ in sc.seqs), sc.tokens)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", range(len(MIXED)), ids=[sc.name for sc, _ in MIXED])
def test_one_call_matches_float64_reference(case: int, dtype: str) -> None:
    sc, block_q = MIXED[case]
    x = paged_inputs(sc, dtype, seed=31 + case)
    cfg = fa.AttentionConfig(paged_block_q=block_q, paged_pages_per_block=2)
    out = fa.ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **features(sc), config=cfg,
                                    implementation="pallas")
    ref = fa.reference_ragged_paged_attention(*(x[k] for k in ARGS), sinks=x["sinks"], **features(sc))
    assert f"block_q {block_q}," in fa.last_tuning()
    got = np.asarray(out[0], np.float32)
    assert np.isfinite(got).all()
    assert (got[_padding_rows(sc)] == 0).all()
    err = relative_error(flat(*out), flat(*ref))
    assert err <= tolerance(dtype), f"{sc.name} {dtype}: {err}"
    # every real row was written (a row an item missed would keep the zeros it started as)
    real = np.concatenate([np.arange(s, s + q) for s, (q, _) in zip(x["cu_q_lens"], sc.seqs, strict=False)])
    assert (np.abs(got[real]).sum(axis=(1, 2)) > 0).all()


def _program(sc: PagedScenario, block_q: int):
    """The jaxpr of a mixed batch through the pallas implementation."""
    x = paged_inputs(sc, "bfloat16", seed=0)
    cfg = fa.AttentionConfig(paged_block_q=block_q)
    return jax.make_jaxpr(lambda *a: fa.ragged_paged_attention(*a, config=cfg, implementation="pallas"))(
        *(x[k] for k in ARGS)).jaxpr


def _eqns(jx):
    for eqn in jx.eqns:
        yield eqn
        for sub in jaxprs_in_params(eqn.params):
            yield from _eqns(sub)


def test_mixed_batch_is_one_attention_call_with_no_regrouping() -> None:
    """Decode steps and prefill chunks go through one attention pallas_call (beside the cache write), and the
    queries reach it as given: no gather or transpose outside the kernel moves anything query-sized."""
    sc, block_q = MIXED[0]
    eqns = list(_eqns(_program(sc, block_q)))
    names = sorted(kernel_name(e) for e in eqns if e.primitive.name == "pallas_call")
    assert names == ["ragged_paged_attention_cache_write", "ragged_paged_attention_mixed_store"], names
    moved = [(e.primitive.name, v.aval.shape) for e in eqns if e.primitive.name in ("gather", "transpose")
             for v in e.outvars if np.prod(v.aval.shape) >= sc.hq * sc.d]
    assert not moved, moved


#: Reaches shorter than a kv block (pages of 16, 4 pages a block, 4 tokens an item): the first item (tokens 28..31 of
#: a 40-long sequence) reads pages 0 and 1 only, so the slots of positions 32..39, inside the sequence, stay as fresh
#: VMEM left them; a window of 10 reaches 1-2 pages; most blocks read only some of their pages.
PARTIAL = PagedScenario("partial_blocks_window", ((12, 40), (1, 40), (3, 35), (9, 64), (1, 17), (6, 6)), hq=4, hkv=2,
                        d=128, page_size=16, pages_per_seq=4, pad=2, window=10)


@pytest.mark.parametrize("sc", [PARTIAL, PagedScenario("partial_blocks_causal", PARTIAL.seqs, hq=4, hkv=2, d=128,
                                                       page_size=16, pages_per_seq=4, pad=2)], ids=lambda s: s.name)
def test_unread_pages_of_a_block_never_reach_the_output(sc: PagedScenario) -> None:
    """The TPU simulator fills fresh VMEM with NaN: a block's pages past what its item sees are not copied, so those
    slots hold NaN (first use) or another item's pages; the output must still match the reference, NaN-free."""
    from jax.experimental.pallas import tpu as pltpu

    x = paged_inputs(sc, "float32", seed=5)
    cfg = fa.AttentionConfig(paged_block_q=4, paged_pages_per_block=4)
    params = pltpu.InterpretParams(uninitialized_memory="nan")
    out = fa.ragged_paged_attention(*(x[k] for k in ARGS), **features(sc), config=cfg, implementation="pallas",
                                    interpret=params)
    ref = fa.reference_ragged_paged_attention(*(x[k] for k in ARGS), **features(sc))
    assert np.isfinite(np.asarray(out[0])).all()
    assert relative_error(flat(*out), flat(*ref)) <= tolerance("float32")


def test_a_kv_block_computes_in_chunks_that_divide_it() -> None:
    """A kv block runs in as few equal chunks of at most 512 columns as divide it into whole 128-lane columns (else
    whole), a mixed item's and a decode item's alike."""
    from flash_attention.pallas_paged import PagedStatic

    def chunk(pages: int, page_size: int, mixed: int = 8) -> int:
        return PagedStatic(sm_scale=1.0, window=None, soft_cap=None, has_sinks=False, causal=True,
                           page_size=page_size, pages_per_block=pages, pages_per_seq=64, num_pages=64, kv_heads=1,
                           steps=1, mixed_block_q=mixed).kv_compute

    assert [chunk(p, 128) for p in (2, 4, 5, 6, 8, 9, 16)] == [256, 512, 128, 384, 512, 384, 512]
    assert chunk(33, 16) == 528 and chunk(40, 16) == 128
    assert [chunk(p, 128, mixed=0) for p in (4, 6, 16)] == [512, 384, 512]


#: Pages of 128 and 5 a block (640 positions: five chunks of 128): reaches that end inside the block's first chunk,
#: mid-block and on a chunk's edge, sequences over several blocks, a window narrower than a chunk.
CHUNKED = PagedScenario("kv_chunks", ((9, 700), (1, 1300), (20, 250), (0, 5), (1, 128), (33, 640), (4, 1281)),
                        hq=4, hkv=2, d=128, page_size=128, pages_per_seq=11, pad=2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("window", [None, 100])
def test_chunked_blocks_match_the_reference_and_skip_unread_pages(dtype: str, window: int | None) -> None:
    """Against the float64 reference, with fresh VMEM filled with NaN: the chunks past an item's reach are skipped
    and the partial ones masked, so nothing unread reaches the output."""
    from jax.experimental.pallas import tpu as pltpu

    sc = CHUNKED if window is None else PagedScenario("kv_chunks_window", CHUNKED.seqs, hq=4, hkv=2, d=128,
                                                      page_size=128, pages_per_seq=11, pad=2, window=window)
    x = paged_inputs(sc, dtype, seed=17)
    cfg = fa.AttentionConfig(paged_block_q=8, paged_pages_per_block=5)
    out = fa.ragged_paged_attention(*(x[k] for k in ARGS), **features(sc), config=cfg, implementation="pallas",
                                    interpret=pltpu.InterpretParams(uninitialized_memory="nan"))
    ref = fa.reference_ragged_paged_attention(*(x[k] for k in ARGS), **features(sc))
    assert "5 pages" in fa.last_tuning() or "pages_per_block 5" in fa.last_tuning(), fa.last_tuning()
    assert np.isfinite(np.asarray(out[0], np.float32)).all()
    assert relative_error(flat(*out), flat(*ref)) <= tolerance(dtype)
