"""The cache-write kernel (pallas_paged_write): rows copied as runs of consecutive slots, each run as power-of-two
DMAs. Checked against a NumPy scatter (bit-exact: a write is a copy) on fresh random rows for every run length
1..page_size at every kind of start (slot 0, mid-page, ending on the page's last slot), runs cut by a page boundary,
padding rows between runs, f32, bf16, fp8 (quantized on store) and stacked caches with a traced layer; the run
finder against a loop over the rows; the static run bound against random (and garbage) metadata; and through the
entry against the float64 reference with chunks that start mid-page, cross pages, and an empty sequence."""

from __future__ import annotations

import flash_attention as fa
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flash_attention.paged_cases import PagedScenario, flat, paged_inputs
from flash_attention.paged_checks import PagedShapes
from flash_attention.paged_layout import max_write_runs, metadata, token_destinations
from flash_attention.pallas_paged_write import piece_sizes, row_runs, write_pages
from jax.experimental.pallas import tpu as pltpu

from kernel_hub.verify.numerics import relative_error, tolerance

HKV, D = 2, 128


def loop_runs(page: np.ndarray, slot: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(first row, page, slot, rows) of every run, by walking the rows one at a time."""
    runs: list[list[int]] = []
    for t, (p, s) in enumerate(zip(page.tolist(), slot.tolist(), strict=True)):
        if p < 0:
            continue
        if runs and runs[-1][0] + runs[-1][3] == t and runs[-1][1] == p and runs[-1][2] + runs[-1][3] == s:
            runs[-1][3] += 1
        else:
            runs.append([t, p, s, 1])
    return [tuple(r) for r in runs]


def np_scatter(cache: np.ndarray, rows: np.ndarray, page: np.ndarray, slot: np.ndarray) -> np.ndarray:
    out = cache.copy()
    for t in range(len(page)):
        if page[t] >= 0:
            out[page[t], slot[t]] = rows[t]
    return out


def every_length(page_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """(page, slot, pages in the cache): a run of every length 1..page_size, each on its own page at a start that
    cycles through slot 0, the last start that fits and one between; padding rows (page -1) between some runs;
    then consecutive positions cut by a page boundary (the last 3 slots of one page, the first 5 of the next)."""
    page, slot = [], []
    pages = rng.permutation(page_size + 4)  # shuffled page ids: runs land on non-adjacent pages
    for n in range(1, page_size + 1):
        start = (0, page_size - n, (page_size - n) // 2)[n % 3]
        page += [int(pages[n - 1])] * n
        slot += list(range(start, start + n))
        if n % 2:
            pad = int(rng.integers(1, 3))
            page += [-1] * pad
            slot += [int(x) for x in rng.integers(0, page_size, pad)]
    a, b = int(pages[page_size]), int(pages[page_size + 1])
    page += [a] * 3 + [b] * 5
    slot += list(range(page_size - 3, page_size)) + list(range(5))
    return np.array(page, np.int32), np.array(slot, np.int32), page_size + 4


def _random_rows(rng, shape, dtype):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32), dtype)


@pytest.mark.parametrize("seed", range(6))
def test_runs_match_a_loop_over_the_rows(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ps = int(rng.choice([8, 16]))
    page, slot = [], []
    while len(page) < 60:  # segments: padding, a sequence's consecutive positions, or a stray row
        kind = rng.integers(3)
        n = int(rng.integers(1, 2 * ps + 3))
        if kind == 0:
            page += [-1] * n
            slot += [int(x) for x in rng.integers(0, ps, n)]
        elif kind == 1:
            pos = int(rng.integers(0, 3 * ps)) + np.arange(n)
            table = rng.integers(0, 5, 8)  # few page ids: neighbouring segments may share a page
            page += [int(table[p // ps]) for p in pos]
            slot += [int(p % ps) for p in pos]
        else:
            page.append(int(rng.integers(-1, 5)))
            slot.append(int(rng.integers(0, ps)))
    page, slot = np.array(page, np.int32), np.array(slot, np.int32)
    want = loop_runs(page, slot)
    runs = row_runs(jnp.asarray(page), jnp.asarray(slot), len(page))
    count = int(runs.count[0])
    got = list(zip(*(np.asarray(a)[:count].tolist() for a in (runs.row, runs.page, runs.slot, runs.length)),
                   strict=True))
    assert got == want
    assert (np.asarray(runs.length)[count:] == 0).all()
    assert all(1 <= n <= ps for *_, n in got)


def test_pieces_sum_to_every_run_length() -> None:
    for ps in (8, 16, 24, 128):
        sizes = piece_sizes(ps)
        assert len(sizes) <= int(np.log2(ps)) + 1 and sizes == tuple(sorted(sizes, reverse=True))
        for n in range(1, ps + 1):
            used = [s for s in sizes if (n // s) % 2]
            assert sum(used) == n, (ps, n)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("page_size", [8, 16])
def test_every_run_length_and_start_lands_exactly(page_size: int, dtype: str) -> None:
    rng = np.random.default_rng(page_size + len(dtype))
    page, slot, num_pages = every_length(page_size, rng)
    t = len(page)
    keys, values = _random_rows(rng, (t, HKV, D), dtype), _random_rows(rng, (t, HKV, D), dtype)
    kc, vc = (_random_rows(rng, (num_pages, page_size, HKV, D), dtype) for _ in range(2))
    want_k = np_scatter(np.asarray(kc, np.float32), np.asarray(keys, np.float32), page, slot)
    want_v = np_scatter(np.asarray(vc, np.float32), np.asarray(values, np.float32), page, slot)
    k2, v2 = write_pages(kc, vc, keys, values, jnp.asarray(page), jnp.asarray(slot), interpret=True)
    assert k2.dtype == kc.dtype and k2.shape == kc.shape
    np.testing.assert_array_equal(np.asarray(k2, np.float32), want_k)
    np.testing.assert_array_equal(np.asarray(v2, np.float32), want_v)


def test_the_simulator_sees_no_race_and_every_wait_matched() -> None:
    """Under the TPU simulator (DMA semaphores counted, fresh memory NaN, race detector on) the run copies and their
    waits balance and no two DMAs touch one slot."""
    rng = np.random.default_rng(5)
    page, slot, num_pages = every_length(8, rng)
    t = len(page)
    keys, values = _random_rows(rng, (t, HKV, D), "float32"), _random_rows(rng, (t, HKV, D), "float32")
    kc, vc = (_random_rows(rng, (num_pages, 8, HKV, D), "float32") for _ in range(2))
    try:
        k2, v2 = write_pages(kc, vc, keys, values, jnp.asarray(page), jnp.asarray(slot),
                             interpret=fa.race_checking_params(seed=1, num_cores=1))
        np.testing.assert_array_equal(np.asarray(k2), np_scatter(np.asarray(kc), np.asarray(keys), page, slot))
        np.testing.assert_array_equal(np.asarray(v2), np_scatter(np.asarray(vc), np.asarray(values), page, slot))
        assert not fa.races_found()
    finally:
        pltpu.reset_tpu_interpret_mode_state()


@pytest.mark.parametrize("cache_dtype", ["float32", "float8_e4m3fn"])
def test_stacked_caches_with_a_traced_layer(cache_dtype: str) -> None:
    """Rows land at [layer, page, slot] of the stacks (the layer traced under jit), quantized on store for fp8
    (x / scale clipped to +-448, then cast: NumPy's own e4m3 cast here); every other layer is bit-identical."""
    rng = np.random.default_rng(9)
    page, slot, num_pages = every_length(16, rng)
    t, layers, scale = len(page), 3, 0.25
    keys = rng.standard_normal((t, HKV, D)).astype(np.float32) * 40  # some |x| / scale past 448: saturates
    values = rng.standard_normal((t, HKV, D)).astype(np.float32)
    stack = lambda: rng.standard_normal((layers, num_pages, 16, HKV, D)).astype(np.float32)
    ks, vs = (jnp.asarray(stack(), cache_dtype) for _ in range(2))
    fp8 = cache_dtype == "float8_e4m3fn"
    s = scale if fp8 else 1.0

    def stored(x):
        return np.clip(x / s, -448, 448).astype(ml_dtypes.float8_e4m3fn) if fp8 else x

    call = jax.jit(lambda k_s, v_s, k, v, p, sl, layer: write_pages(
        k_s, v_s, k, v, p, sl, interpret=True, k_scale=s, v_scale=s, layer=layer))
    k2, v2 = call(ks, vs, jnp.asarray(keys), jnp.asarray(values), jnp.asarray(page), jnp.asarray(slot),
                  jnp.int32(1))
    view = (lambda a: np.asarray(a).view(np.uint8)) if fp8 else np.asarray
    for got, before, rows in ((k2, ks, keys), (v2, vs, values)):
        assert got.dtype == before.dtype and got.shape == before.shape
        want = np_scatter(np.asarray(before[1]), stored(rows), page, slot)
        np.testing.assert_array_equal(view(got[1]), view(want))
        for other in (0, 2):
            np.testing.assert_array_equal(view(got[other]), view(before[other]))


def _shapes(tokens: int, max_seqs: int, page_size: int, pages_per_seq: int, num_pages: int) -> PagedShapes:
    return PagedShapes(tokens=tokens, q_heads=1, kv_heads=1, head_dim=128, num_pages=num_pages,
                       page_size=page_size, max_seqs=max_seqs, pages_per_seq=pages_per_seq, sm_scale=1.0,
                       window=None, soft_cap=None)


@pytest.mark.parametrize("seed", range(8))
def test_the_static_run_bound_holds_for_any_metadata(seed: int) -> None:
    """max_write_runs bounds the runs token_destinations' rows form, for valid metadata and for garbage (the
    clamped metadata of a traced call: cu_q_lens decreasing, lengths short or past the pages, bad page ids)."""
    rng = np.random.default_rng(seed)
    s, ps, pps = int(rng.integers(1, 7)), int(rng.choice([8, 16])), int(rng.integers(1, 6))
    tokens, num_pages = int(rng.integers(1, 80)), s * pps + 2
    sh = _shapes(tokens, s, ps, pps, num_pages)
    for garbage in (False, True):
        if garbage:
            cu = rng.integers(-5, tokens + 5, s + 1)
            kv = rng.integers(-3, pps * ps + 10, s)
            table = rng.integers(-2, num_pages + 2, (s, pps))
        else:
            q = rng.multinomial(int(rng.integers(0, tokens + 1)), np.ones(s) / s)
            kv = np.minimum(q + rng.integers(0, pps * ps, s), pps * ps)
            q = np.minimum(q, kv)
            cu = np.concatenate([[0], np.cumsum(q)])
            table = rng.permutation(num_pages)[: s * pps].reshape(s, pps)
        meta = metadata(jnp.asarray(kv, jnp.int32), jnp.asarray(table, jnp.int32), jnp.asarray(cu, jnp.int32),
                        None, sh)
        page, slot = (np.asarray(a) for a in token_destinations(meta, sh))
        assert len(loop_runs(page, slot)) <= max_write_runs(sh), (garbage, cu, kv)


#: A chunk starting mid-page and crossing two page boundaries, one ending on a page's last slot, one filling a whole
#: page from slot 0, an empty sequence, decode steps, padding rows and an unused slot: pages of 8 (f32) and of 16
#: (bf16, whose sublane tiles the kernel needs whole).
RUNS = {
    "float32": PagedScenario("runs_page8", ((13, 21), (0, 5), (1, 9), (8, 16), (5, 8), (1, 1)), hq=4, hkv=2, d=128,
                             page_size=8, pages_per_seq=3, pad=3, empty_slots=1),
    "bfloat16": PagedScenario("runs_page16", ((29, 37), (0, 5), (1, 9), (16, 32), (5, 16), (1, 1)), hq=4, hkv=2,
                              d=128, page_size=16, pages_per_seq=3, pad=3, empty_slots=1),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_through_the_entry_against_the_reference(dtype: str) -> None:
    sc = RUNS[dtype]
    x = paged_inputs(sc, dtype, seed=21)
    args = [x[k] for k in ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices",
                           "cu_q_lens", "num_seqs")]
    out = fa.ragged_paged_attention(*args, implementation="pallas")
    ref = fa.reference_ragged_paged_attention(*args)
    assert relative_error(flat(*out), flat(*ref)) <= tolerance(dtype)
    page, slot = [], []
    for i, (q_len, kv_len) in enumerate(sc.seqs):
        for j in range(q_len):
            pos = kv_len - q_len + j
            page.append(int(x["page_indices"][i, pos // sc.page_size]))
            slot.append(pos % sc.page_size)
    page += [-1] * sc.pad
    slot += [0] * sc.pad
    page, slot = np.array(page, np.int32), np.array(slot, np.int32)
    assert any(n > 1 and s > 0 for _, _, s, n in loop_runs(page, slot))  # a run starting mid-page is in the case
    for got, cache, rows in ((out[1], x["k_cache"], x["keys"]), (out[2], x["v_cache"], x["values"])):
        want = np_scatter(np.asarray(cache, np.float32), np.asarray(rows, np.float32), page, slot)
        np.testing.assert_array_equal(np.asarray(got, np.float32), want)
