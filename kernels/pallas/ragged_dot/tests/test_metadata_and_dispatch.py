"""Group metadata invariants, tiling heuristics and implementation dispatch (pure functions, fast)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd
from ragged_dot._vendor.cpu_gmm import default_capacity
from ragged_dot._vendor.moe_shapes import MOE_MODELS, PHASES
from ragged_dot.pallas.config import (
    backward_config,
    backward_vmem_bytes,
    default_config,
    transposed_config,
    usable_vmem,
    vmem_bytes,
)
from ragged_dot.pallas.metadata import (
    block_shift,
    forward_items,
    group_offsets,
    make_group_metadata,
    num_work_items,
    pack_forward,
)


def _random_sizes(rng, g, m):
    kind = rng.integers(0, 4)
    if kind == 0:
        return np.bincount(rng.integers(0, g, m), minlength=g)
    if kind == 1:
        s = np.zeros(g, int)
        s[rng.integers(0, g)] = m
        return s
    if kind == 2:
        return np.bincount(rng.integers(0, g, rng.integers(0, m + 1)), minlength=g)
    return np.zeros(g, int)


@pytest.mark.parametrize("seed", range(8))
def test_metadata_invariants(seed):
    rng = np.random.default_rng(seed)
    g, tm = int(rng.integers(1, 9)), int(rng.choice([4, 8, 16]))
    m = int(rng.integers(1, 70))
    mp = -(-m // tm) * tm
    sizes = _random_sizes(rng, g, m)
    md = {k: np.asarray(v) for k, v in make_group_metadata(jnp.asarray(sizes, jnp.int32), m_padded=mp, tm=tm, m=m)
          ._asdict().items()}
    w = num_work_items(mp, tm, g)
    assert all(v.shape == (w,) for v in md.values())
    # output blocks are revisited only on consecutive steps
    assert (np.diff(md["tile"]) >= 0).all() and (np.diff(md["group"]) >= 0).all()
    # every m-tile and every group is visited (zeros for untouched rows, zeros for empty groups' grads)
    assert set(md["tile"]) == set(range(mp // tm)) and set(md["group"]) == set(range(g))
    # the row ranges partition [0, sum(sizes)) exactly, each inside its tile and its group
    ends = np.minimum(np.cumsum(sizes), m)
    starts = ends - np.minimum(sizes, ends)
    covered = np.zeros(mp, int)
    for t, grp, lo, hi in zip(md["tile"], md["group"], md["row_lo"], md["row_hi"], strict=True):
        if hi > lo:
            assert t * tm <= lo and hi <= (t + 1) * tm and starts[grp] <= lo and hi <= ends[grp]
            covered[lo:hi] += 1
    assert (covered[: ends[-1]] == 1).all() and not covered[ends[-1]:].any()
    # items without rows fetch what the previous item fetched (no extra DMA)
    for i in range(1, w):
        if md["row_hi"][i] == md["row_lo"][i]:
            assert (md["fetch_tile"][i], md["fetch_group"][i]) == (md["fetch_tile"][i - 1], md["fetch_group"][i - 1])


def test_default_config_fits_vmem_and_tiles():
    for m, k, n, dt in [(512, 2048, 768, "bfloat16"), (8, 64, 96, "float32"), (4096, 7168, 2048, "float32")]:
        cfg = default_config(m, k, n, 128, dt)
        assert cfg.tk % 128 == 0 or cfg.tk == k
        assert cfg.tn % 128 == 0 or cfg.tn == n
        assert cfg.tm % 8 == 0
        assert vmem_bytes(cfg, 2 if dt == "bfloat16" else 4, 4) <= 16 * 2**20
    assert 768 % default_config(512, 2048, 768, 128).tn == 0  # divides 768: weights need no padding
    with pytest.raises(ValueError):
        rd.RaggedDotConfig(tm=0)
    assert rd.RaggedDotConfig(tk=256, tn=128).swapped_kn() == rd.RaggedDotConfig(tk=128, tn=256)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_backward_tiles_fit_vmem_at_every_model_geometry(dtype):
    """The d_lhs kernel's tiles (K and N swapped) fit the budget and divide the padded dims, for every projection
    of every model geometry; unchanged where the swapped forward tiles already fit."""
    itemsize = 2 if dtype == "bfloat16" else 4
    shrunk = []
    for geo in MOE_MODELS:
        for tokens in PHASES.values():
            for proj, m, k, n, g in geo.projections(tokens):
                cfg = backward_config(m, k, n, g, dtype)
                kp, np_ = -(-k // cfg.tk) * cfg.tk, -(-n // cfg.tn) * cfg.tn
                lhs_cfg = transposed_config(cfg, kp, np_, itemsize)
                fits = backward_vmem_bytes(lhs_cfg, itemsize, itemsize) <= usable_vmem(itemsize)
                assert fits, (geo.model, proj, lhs_cfg)
                assert np_ % lhs_cfg.tk == 0 and kp % lhs_cfg.tn == 0 and lhs_cfg.tm == cfg.tm
                assert lhs_cfg.tk % 128 == 0 or lhs_cfg.tk == np_
                assert lhs_cfg.tn % 128 == 0 or lhs_cfg.tn == kp
                if backward_vmem_bytes(cfg.swapped_kn(), itemsize, itemsize) <= usable_vmem(itemsize):
                    assert lhs_cfg == cfg.swapped_kn()
                else:
                    shrunk.append((geo.model, proj))
    if dtype == "bfloat16":  # the case libtpu refused on v4 and v5p (16.49 MiB of 16)
        assert ("gpt_oss_20b", "gate_up") in shrunk


def test_shrunk_backward_tiles_give_the_same_numbers():
    """d_lhs through the transposed kernel with tiles re-fitted to a tiny VMEM budget, interpreted, against NumPy."""
    from ragged_dot.pallas import gmm as pallas_gmm

    rng = np.random.default_rng(7)
    sizes = np.array([40, 0, 64, 24], np.int32)
    m, k, n = 128, 256, 384
    cfg = rd.RaggedDotConfig(tm=32, tk=256, tn=384)
    small = transposed_config(cfg, k, n, 4, vmem_budget_bytes=1 << 20)
    assert (small.tk, small.tn) != (cfg.tn, cfg.tk)  # the budget forced smaller tiles
    dout = rng.standard_normal((m, n)).astype(np.float32)
    rhs = rng.standard_normal((len(sizes), k, n)).astype(np.float32)
    meta = make_group_metadata(jnp.asarray(sizes), m_padded=m, tm=cfg.tm, m=m)
    got = np.asarray(pallas_gmm.gmm(jnp.asarray(dout), jnp.asarray(rhs), meta, cfg=small, out_dtype=jnp.float32,
                                    transpose_rhs=True, interpret=True,
                                    offsets=group_offsets(jnp.asarray(sizes), m)))
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    want = np.zeros((m, k))
    for grp in range(len(sizes)):
        lo, hi = bounds[grp], bounds[grp + 1]
        want[lo:hi] = dout[lo:hi].astype(np.float64) @ rhs[grp].astype(np.float64).T
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() / np.abs(want).max() <= 1e-5


def test_default_capacity_is_bounded():
    assert default_capacity(512, 128) == 16
    assert default_capacity(8, 128) == 8
    assert 512 < default_capacity(4096, 8) < 640


def test_implementations_for():
    assert rd.implementations_for("tpu") == ("pallas", "xla")
    assert rd.implementations_for("cpu") == ("cpu", "xla")
    assert rd.implementations_for("cuda")[0] == "xla"
    assert rd.implementations_for("something-new")[0] == "xla"


def test_resolve_implementation():
    assert rd.resolve_implementation("cpu")[0] == "cpu"
    assert rd.resolve_implementation("tpu")[0] == "pallas"
    assert rd.resolve_implementation("cpu", ("xla", "cpu"))[0] == "xla"  # a sequence: the first that runs
    name, why = rd.resolve_implementation("cpu", "pallas")  # Pallas off a TPU interprets by itself
    assert name == "pallas" and "interpreted (fast interpreter" in why
    assert "TPU simulator" in rd.resolve_implementation("cpu", "pallas", interpret=rd.race_checking_params())[1]
    # interpret=False lowers to Mosaic even here: what an ahead-of-time TPU compile on a CPU host needs
    assert "compiled by Mosaic" in rd.resolve_implementation("cpu", "pallas", interpret=False)[1]
    assert "compiled by Mosaic" in rd.resolve_implementation("tpu", "pallas")[1]
    with pytest.raises(ValueError, match="unknown ragged_dot implementation 'triton'; known: pallas, cpu, xla"):
        rd.resolve_implementation("cpu", "triton")


def test_last_implementation_and_argument_checks():
    lhs, rhs = jnp.ones((8, 16)), jnp.ones((2, 16, 4))
    rd.ragged_dot(lhs, rhs, jnp.array([4, 4], jnp.int32))
    assert rd.last_implementation()[0] == rd.implementations_for(__import__("jax").default_backend())[0]
    with pytest.raises(ValueError):
        rd.ragged_dot(lhs, rhs, jnp.array([8], jnp.int32))
    with pytest.raises(ValueError):
        rd.ragged_dot(lhs, jnp.ones((2, 8, 4)), jnp.array([4, 4], jnp.int32))
    with pytest.raises(TypeError):
        rd.ragged_dot(lhs, rhs, jnp.array([4.0, 4.0]))


def test_public_surface():
    for name in ("ragged_dot", "RaggedDotConfig", "default_config", "reference_ragged_dot", "implementations_for",
                 "resolve_implementation", "last_implementation", "IMPLEMENTATIONS", "ORDER", "races_found",
                 "race_checking_params"):
        assert name in rd.__all__ and hasattr(rd, name)


def test_reference_is_a_plain_loop():
    a = np.arange(6.0).reshape(3, 2)
    b = np.stack([np.eye(2), 2 * np.eye(2)])
    out = rd.reference_ragged_dot(a, b, np.array([1, 1]))
    np.testing.assert_array_equal(out, [[0, 1], [4, 6], [0, 0]])


@pytest.mark.parametrize("sizes, m, tm", [
    ([100, 0, 200, 12, 0, 150, 50, 0], 512, 128),  # empty groups between and after
    ([0, 0, 512, 0], 512, 128),  # one group holds every row
    ([100, 0, 60, 0], 512, 128),  # rows end early: tiles 2 and 3 hold none
    ([0, 0, 0], 256, 128),  # no rows at all
    ([3, 1, 4, 1, 5], 16, 16),  # decode-like: a few rows per group in one tile
])
def test_forward_items_are_the_pairs_with_rows_plus_one_per_empty_tile(sizes, m, tm):
    """By brute force over rows: the forward runs each (tile, group) pair holding rows once, in order, plus one
    zero-writing item per tile holding none; nothing else (the empty groups' visits are the transposed kernel's)."""
    meta = make_group_metadata(jnp.asarray(sizes, jnp.int32), m_padded=m, tm=tm, m=m)
    kept, n = forward_items(meta, m // tm)
    n = int(n)
    owner = np.repeat(np.arange(len(sizes)), sizes)  # group of each real row
    pairs = sorted({(r // tm, int(owner[r])) for r in range(len(owner))})
    empty_tiles = [t for t in range(m // tm) if not any(p[0] == t for p in pairs)]
    assert n == len(pairs) + len(empty_tiles)
    tile, lo, hi = (np.asarray(a)[:n] for a in (kept.tile, kept.row_lo, kept.row_hi))
    group = np.asarray(kept.group)[:n]
    with_rows = [(int(t), int(g)) for t, g, a, b in zip(tile, group, lo, hi, strict=True) if a < b]
    assert with_rows == pairs
    assert sorted(int(t) for t, a, b in zip(tile, lo, hi, strict=True) if a == b) == empty_tiles
    assert np.all(np.diff(tile) >= 0)  # an output tile is revisited only on consecutive steps


_FORWARD_CASES = [
    ([100, 0, 200, 12, 0, 150, 50, 0], 512, 128),
    ([0, 0, 512, 0], 512, 128),
    ([100, 0, 60, 0], 512, 128),
    ([0, 0, 0], 256, 128),
    ([3, 1, 4, 1, 5], 16, 16),
    ([0] * 7 + [9], 64, 16),  # every row in the last group, tiles past them
]


@pytest.mark.parametrize("sizes, m, tm", _FORWARD_CASES)
def test_packed_items_are_what_the_forward_runs(sizes, m, tm):
    """Unpacked, the forward's prefetch gives every item it runs (brute force over rows, as above): its tile, the
    rows its group owns in that tile (computed as the kernel does, from the offsets), and blocks to fetch that hold
    rows whenever any item does; the list is cut to tiles + groups - 1 and every run item fits in it."""
    gs = jnp.asarray(sizes, jnp.int32)
    tiles, g = m // tm, len(sizes)
    meta = make_group_metadata(gs, m_padded=m, tm=tm, m=m)
    shift = block_shift(g, tiles)
    packed, bound = pack_forward(meta, group_offsets(gs, m), tiles, shift)
    n = int(bound)
    items, fetch, offsets = (np.asarray(a) for a in packed)
    assert items.shape == fetch.shape == (tiles + g - 1,) and n <= tiles + g - 1
    assert offsets.tolist() == [0, *np.cumsum(sizes).tolist()]
    tile, group = items[:n] >> shift, items[:n] & ((1 << shift) - 1)
    lo = np.maximum(offsets[group], tile * tm)
    hi = np.minimum(offsets[group + 1], tile * tm + tm)
    owner = np.repeat(np.arange(g), sizes)
    pairs = sorted({(r // tm, int(owner[r])) for r in range(len(owner))})
    assert [(int(t), int(e)) for t, e, a, b in zip(tile, group, lo, hi, strict=True) if a < b] == pairs
    empty = [t for t in range(tiles) if not any(p[0] == t for p in pairs)]
    assert sorted(int(t) for t, a, b in zip(tile, lo, hi, strict=True) if a >= b) == empty
    fetched = fetch[:n] & ((1 << shift) - 1)
    if pairs:  # a tile without rows loads a block that has rows: no empty expert's weights are read
        assert all(sizes[e] > 0 for e in fetched)
        assert set((fetch[:n] >> shift).tolist()) <= {t for t, _ in pairs}


def test_a_tile_count_that_does_not_pack_is_refused():
    with pytest.raises(ValueError, match="larger row tile"):
        block_shift(1 << 12, 1 << 20)
    assert block_shift(1, 8) == 1 and block_shift(128, 4) == 7 and block_shift(129, 4) == 8
