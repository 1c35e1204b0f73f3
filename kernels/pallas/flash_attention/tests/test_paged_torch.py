"""The torch builds' paged attention: `ragged_paged_attention` (the JAX contract's entry on torch tensors),
`flash_attn_with_kvcache` and `flash_attn_varlen_func(block_table=)` against a float64 softmax attention written here
over each sequence's keys laid out contiguously (never read back through the page table under test): mixed prefill and
decode in one call, page boundaries, pages in shuffled order, an empty slot, GQA/MQA, sliding window, soft-cap, sinks,
bf16 and f32; the new rows land in their pages; bad page tables are one clear error with nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def fa():
    """The torch-cpu build as it ships (its __init__ is torch_api.py)."""
    import kernel_hub as kh

    return kh.get_local_kernel(Path(__file__).resolve().parents[1], framework="torch", backend="cpu")


def reference(q_seq, k_seq, v_seq, *, causal=True, window=None, scale, cap=None, sinks=None):
    """One sequence in float64: q [n, Hq, D] at the last n of L positions, k/v [L, Hkv, D] -> [n, Hq, D]."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q_seq, k_seq, v_seq))
    n, hq, _ = q.shape
    length, hkv = k.shape[0], k.shape[1]
    out = np.zeros_like(q)
    for h in range(hq):
        kh, vh = k[:, h // (hq // hkv)], v[:, h // (hq // hkv)]
        for i in range(n):
            pos = length - n + i
            j = np.arange(length)
            keep = np.ones(length, dtype=bool)
            if causal:
                keep &= j <= pos
            if window is not None:
                keep &= j > pos - window
            logits = kh @ q[i, h] * scale
            if cap is not None:
                logits = cap * np.tanh(logits / cap)
            logits = np.where(keep, logits, -np.inf)
            extra = [] if sinks is None else [float(sinks[h])]
            top = max([logits.max(), *extra])
            if not np.isfinite(top):
                continue
            w = np.exp(logits - top)
            denom = w.sum() + sum(np.exp(e - top) for e in extra)
            out[i, h] = (w / denom) @ vh
    return out


def build(seed, *, q_lens, kv_lens, hq, hkv, d=16, page=4, slots=None, dtype=torch.float32, spare_pages=3):
    """A random paged cache holding each sequence's first kv_len - q_len keys, pages shuffled; the history (the full
    keys per sequence, new rows included) is kept contiguous for the reference."""
    g = torch.Generator().manual_seed(seed)
    slots = len(q_lens) if slots is None else slots
    per_seq = max(-(-n // page) for n in kv_lens) + 1
    num_pages = slots * per_seq + spare_pages
    perm = torch.randperm(num_pages, generator=g)
    table = perm[: slots * per_seq].reshape(slots, per_seq).to(torch.int32)
    k_cache = torch.randn(num_pages, page, hkv, d, generator=g).to(dtype)  # garbage where nothing is written
    v_cache = torch.randn(num_pages, page, hkv, d, generator=g).to(dtype)
    hist_k, hist_v = [], []
    for s, (n, length) in enumerate(zip(q_lens, kv_lens, strict=True)):
        hk = torch.randn(length, hkv, d, generator=g).to(dtype)
        hv = torch.randn(length, hkv, d, generator=g).to(dtype)
        for p in range(length - n):  # the cached part only; the new rows come with the call
            k_cache[table[s, p // page], p % page] = hk[p]
            v_cache[table[s, p // page], p % page] = hv[p]
        hist_k.append(hk)
        hist_v.append(hv)
    total = sum(q_lens)
    q = torch.randn(total + 2, hq, d, generator=g).to(dtype)  # two padding rows past the last sequence
    keys = torch.zeros(total + 2, hkv, d, dtype=dtype)
    values = torch.zeros(total + 2, hkv, d, dtype=dtype)
    cu = [0]
    for s, n in enumerate(q_lens):
        keys[cu[-1]:cu[-1] + n] = hist_k[s][-n:] if n else hist_k[s][:0]
        values[cu[-1]:cu[-1] + n] = hist_v[s][-n:] if n else hist_v[s][:0]
        cu.append(cu[-1] + n)
    cu += [cu[-1]] * (slots - len(q_lens))
    lens = list(kv_lens) + [0] * (slots - len(kv_lens))
    return dict(q=q, keys=keys, values=values, k_cache=k_cache, v_cache=v_cache, table=table,
                kv_lens=torch.tensor(lens, dtype=torch.int32), cu=torch.tensor(cu, dtype=torch.int32),
                hist_k=hist_k, hist_v=hist_v, q_lens=q_lens)


def expected(case, **opts):
    rows = []
    cu = case["cu"].tolist()
    for s, n in enumerate(case["q_lens"]):
        q = case["q"][cu[s]:cu[s] + n].float().numpy()
        rows.append(reference(q, case["hist_k"][s].float().numpy(), case["hist_v"][s].float().numpy(), **opts))
    out = np.zeros(case["q"].shape)
    out[: cu[len(case["q_lens"])]] = np.concatenate(rows) if rows else 0
    return out


CASES = {
    # name: (q_lens, kv_lens, hq, hkv, options)
    "mixed prefill+decode, GQA": ([5, 1, 1, 3], [5, 9, 4, 11], 4, 2, {}),
    "page boundary (lengths at 4k and 4k+1)": ([1, 1, 4], [8, 9, 4], 2, 2, {}),
    "one token": ([1], [1], 2, 1, {}),
    "MQA, sliding window shorter than the sequence": ([3, 1], [13, 10], 4, 1, {"window": 3}),
    "soft cap and sinks": ([2, 1, 6], [7, 12, 6], 4, 2, {"cap": 2.0, "sinks": True}),
    "non-causal chunk": ([3, 2], [6, 5], 2, 1, {"causal": False}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_ragged_paged_attention_matches_float64_and_writes_the_new_rows(fa, name, dtype):
    q_lens, kv_lens, hq, hkv, opts = CASES[name]
    case = build(len(name), q_lens=q_lens, kv_lens=kv_lens, hq=hq, hkv=hkv, dtype=dtype, slots=len(q_lens) + 1)
    d = case["q"].shape[-1]
    sinks = torch.randn(hq, generator=torch.Generator().manual_seed(7)) if opts.get("sinks") else None
    scale = d ** -0.5
    out, kc, vc = fa.ragged_paged_attention(
        case["q"], case["keys"], case["values"], case["k_cache"], case["v_cache"], case["kv_lens"], case["table"],
        case["cu"], num_seqs=len(q_lens), sinks=sinks, sliding_window=opts.get("window"), soft_cap=opts.get("cap"),
        causal=opts.get("causal", True), implementation="torch")
    assert kc is case["k_cache"] and vc is case["v_cache"]  # updated in place, the same tensors returned
    want = expected(case, causal=opts.get("causal", True), window=opts.get("window"), scale=scale,
                    cap=opts.get("cap"), sinks=None if sinks is None else sinks.numpy())
    assert out.dtype == dtype and out.shape == case["q"].shape
    assert not out.isnan().any()
    assert rel_error(out.float(), torch.from_numpy(want).float()) <= TOL[str(dtype).removeprefix("torch.")], name
    assert torch.equal(out[-2:], torch.zeros_like(out[-2:]))  # rows no sequence owns
    page = case["k_cache"].shape[1]
    for s, length in enumerate(kv_lens):  # every position of every sequence now holds its key
        for p in range(length):
            assert torch.equal(kc[case["table"][s, p // page], p % page], case["hist_k"][s][p])
            assert torch.equal(vc[case["table"][s, p // page], p % page], case["hist_v"][s][p])


def test_flash_attn_with_kvcache_paged_and_contiguous_as_transformers_calls_it(fa):
    """transformers' decode fast path: q/k/v [N, 1, H, D], cache_seqlens = cached lengths, block_table."""
    kv_lens = [6, 9, 1, 13]
    case = build(3, q_lens=[1] * 4, kv_lens=kv_lens, hq=4, hkv=2)
    n = len(kv_lens)
    q, k, v = (case[x][:n, None] for x in ("q", "keys", "values"))
    cached = case["kv_lens"] - 1
    out = fa.flash_attn_with_kvcache(q, case["k_cache"], case["v_cache"], k, v, cache_seqlens=cached,
                                     block_table=case["table"], softmax_scale=0.3, causal=True)
    want = expected(dict(case, q=case["q"][:n]), scale=0.3)
    assert out.shape == q.shape and rel_error(out[:, 0], torch.from_numpy(want).float()) <= TOL["float32"]
    # the same call on a contiguous cache [B, max_len, Hkv, D] (no block table), new rows appended at cache_seqlens
    width = max(kv_lens) + 2
    kc = torch.randn(n, width, 2, 16)
    vc = torch.randn(n, width, 2, 16)
    for s, length in enumerate(kv_lens):
        kc[s, : length - 1] = case["hist_k"][s][: length - 1]
        vc[s, : length - 1] = case["hist_v"][s][: length - 1]
    out2 = fa.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=cached, softmax_scale=0.3, causal=True)
    assert rel_error(out2[:, 0], torch.from_numpy(want).float()) <= TOL["float32"]
    for s, length in enumerate(kv_lens):
        assert torch.equal(kc[s, length - 1], case["hist_k"][s][-1])


def test_flash_attn_varlen_func_with_block_table_reads_the_cache_in_place(fa):
    """A paged varlen call (flash-attn's block_table, vLLM's page_table): k/v are the caches, already holding every
    key; cu_seqlens_k gives each sequence's cached length, and nothing is written."""
    q_lens, kv_lens = [3, 1, 2], [7, 5, 2]
    case = build(11, q_lens=q_lens, kv_lens=kv_lens, hq=4, hkv=2)
    fa.ragged_paged_attention(case["q"], case["keys"], case["values"], case["k_cache"], case["v_cache"],
                              case["kv_lens"], case["table"], case["cu"], implementation="torch")  # fill the cache
    before = case["k_cache"].clone()
    cu_k = torch.tensor([0, *np.cumsum(kv_lens)], dtype=torch.int32)
    want = torch.from_numpy(expected(case, window=4, scale=0.25)).float()
    for name in ("block_table", "page_table"):
        out = fa.flash_attn_varlen_func(case["q"], case["k_cache"], case["v_cache"], case["cu"], cu_k, max(q_lens),
                                        max(kv_lens), softmax_scale=0.25, causal=True, window_size=(3, 3),
                                        **{name: case["table"]})
        assert rel_error(out, want) <= TOL["float32"], name
    assert torch.equal(case["k_cache"], before)


def test_the_page_walk_never_holds_the_whole_cache(fa, monkeypatch):
    """Each step of the walk gathers at most CHUNK_BYTES of keys (whole pages), whatever the cache holds."""
    from importlib import import_module

    paged = import_module(fa.__name__ + ".torch_paged")
    seen = []
    real = paged._attend_chunk

    def spy(q, k, v, keep, soft_cap, has=None):  # one step: the queries against one chunk of keys [S, Hkv, C, D]
        seen.append(k.shape[-2])
        return real(q, k, v, keep, soft_cap, has)

    monkeypatch.setattr(paged, "_attend_chunk", spy)
    case = build(5, q_lens=[1, 2], kv_lens=[30, 21], hq=2, hkv=1)
    call = paged.check_paged_call(case["q"], case["k_cache"], case["v_cache"], case["kv_lens"], case["table"],
                                  case["cu"])
    paged.write_new_rows(case["k_cache"], case["v_cache"], case["keys"], case["values"], case["table"], call)
    chunk = 2 * 8 * 1 * 16 * 4  # two sequences x 8 keys (two pages of 4) x 1 kv head x d16 x f32
    got = paged.paged_attention(case["q"], case["k_cache"], case["v_cache"], case["table"], call, causal=True,
                                sm_scale=0.25, sliding_window=None, soft_cap=None, sinks=None, chunk_bytes=chunk)
    assert seen == [8, 8, 8, 8]  # 30 keys in 8-key steps, never more
    assert rel_error(got, torch.from_numpy(expected(case, scale=0.25)).float()) <= TOL["float32"]


def test_the_fused_and_the_plain_chunk_agree(fa):
    """The two ways a step attends one chunk (torch's fused CPU kernel, a plain masked softmax) give the same output
    and log-sum-exp, rows that keep no key included."""
    from importlib import import_module

    paged = import_module(fa.__name__ + ".torch_paged")
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(3, 2, 5, 16, generator=g), torch.randn(3, 2, 7, 16, generator=g), torch.randn(3, 2, 7, 16,
                                                                                                        generator=g)
    keep = torch.rand(3, 1, 5, 7, generator=g) > 0.4
    keep[0, 0, 2] = False
    fused, lse_fused = paged._attend_chunk(q, k, v, keep, None)
    plain, lse_plain = paged._attend_chunk(q, k, v, keep, 1e9)  # a soft cap that changes nothing takes the plain way
    assert torch.allclose(fused, plain, atol=1e-5) and torch.allclose(lse_fused, lse_plain, atol=1e-5)
    assert torch.isneginf(lse_fused[0, :, 2]).all() and not fused[0, :, 2].any()


@pytest.mark.parametrize("bad,match", [
    ("page_out_of_range", r"page_indices\[1, 1\] = 99 outside the cache's"),
    ("negative_page", r"page_indices\[0, 0\] = -1 outside"),
    ("too_long", r"longer than its 3 pages"),
    ("kv_below_q", r"below the new tokens"),
    ("cu_decreasing", r"cu_q_lens=.*never decrease"),
])
def test_bad_page_tables_are_one_clear_error_and_nothing_is_written(fa, bad, match):
    case = build(2, q_lens=[2, 1], kv_lens=[6, 5], hq=2, hkv=1)
    table, kv_lens, cu = case["table"].clone(), case["kv_lens"].clone(), case["cu"].clone()
    if bad == "page_out_of_range":
        table[1, 1] = 99
    elif bad == "negative_page":
        table[0, 0] = -1
    elif bad == "too_long":
        kv_lens[0] = 13
    elif bad == "kv_below_q":
        kv_lens[0] = 1
    else:
        cu[1] = 3
        cu[2] = 2
    k_before = case["k_cache"].clone()
    with pytest.raises(fa.PagedCacheError, match=match):
        fa.ragged_paged_attention(case["q"], case["keys"], case["values"], case["k_cache"], case["v_cache"], kv_lens,
                                  table, cu, implementation="torch")
    assert torch.equal(case["k_cache"], k_before)


def test_unused_page_table_entries_may_be_minus_one(fa):
    """transformers fills the rest of a page-table row with -1: only the pages a sequence needs are read."""
    case = build(9, q_lens=[1, 1], kv_lens=[3, 6], hq=2, hkv=2)
    case["table"][0, 1:] = -1
    out, _, _ = fa.ragged_paged_attention(case["q"], case["keys"], case["values"], case["k_cache"], case["v_cache"],
                                          case["kv_lens"], case["table"], case["cu"], implementation="torch")
    assert rel_error(out, torch.from_numpy(expected(case, scale=16 ** -0.5)).float()) <= TOL["float32"]


def test_refused_flash_attn_with_kvcache_options_name_what_to_change(fa):
    q = torch.zeros(1, 1, 2, 16)
    cache = torch.zeros(1, 4, 2, 16)
    with pytest.raises(fa.UnsupportedAttentionCall, match="rotary_cos"):
        fa.flash_attn_with_kvcache(q, cache, cache, rotary_cos=torch.zeros(1))
    with pytest.raises(fa.UnsupportedAttentionCall, match="return_softmax_lse"):
        fa.flash_attn_with_kvcache(q, cache, cache, return_softmax_lse=True)
    with pytest.raises(fa.UnsupportedAttentionCall, match="cache_seqlens"):
        fa.flash_attn_with_kvcache(q, cache, cache, q[:, :, :2], q[:, :, :2])


def test_the_jax_implementation_hands_the_contract_arguments_over(fa, monkeypatch):
    """implementation="jax" on CPU: the call crosses to the JAX package's ragged_paged_attention (the contract's
    argument order) through DLPack. Where this build's JAX package has no such entry yet, a stand-in written here from
    the contract (NumPy float64) takes its place, so the hand-over itself is what is checked."""
    pytest.importorskip("jax")
    import importlib

    import jax.numpy as jnp

    api = importlib.import_module(".api", fa.__name__)
    seen = {}
    if not hasattr(api, "ragged_paged_attention"):
        def stand_in(queries, keys, values, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, num_seqs=None, *,
                     sinks=None, sm_scale=None, sliding_window=None, soft_cap=None, causal=True,
                     implementation=None, interpret=None):
            q, kc, vc = (np.asarray(x, dtype=np.float64) for x in (queries, k_cache, v_cache))
            lens, table, cu = np.asarray(kv_lens), np.asarray(page_indices), np.asarray(cu_q_lens)
            n = int(num_seqs)
            seen.update(num_seqs=n, sinks=sinks is not None, keys=np.asarray(keys), window=sliding_window)
            out = np.zeros_like(q)
            page = kc.shape[1]
            for s in range(n):
                rows = slice(cu[s], cu[s + 1])
                pos = np.arange(lens[s])
                k_seq = kc[table[s, pos // page], pos % page]
                v_seq = vc[table[s, pos // page], pos % page]
                out[rows] = reference(q[rows], k_seq, v_seq, causal=causal, window=sliding_window, scale=sm_scale,
                                      cap=soft_cap, sinks=None if sinks is None else np.asarray(sinks))
            return jnp.asarray(out, dtype=queries.dtype), k_cache, v_cache

        monkeypatch.setattr(api, "ragged_paged_attention", stand_in, raising=False)
    case = build(21, q_lens=[4, 1, 1], kv_lens=[4, 7, 10], hq=4, hkv=2, slots=5)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(1))
    out, _, _ = fa.ragged_paged_attention(case["q"], case["keys"], case["values"], case["k_cache"], case["v_cache"],
                                          case["kv_lens"], case["table"], case["cu"], num_seqs=3, sinks=sinks,
                                          sliding_window=5, implementation="jax")
    assert fa.last_implementation()[0] == "jax"
    want = expected(case, window=5, scale=16 ** -0.5, sinks=sinks.numpy())
    assert rel_error(out, torch.from_numpy(want).float()) <= TOL["float32"]
    if seen:  # the stand-in saw the contract's arguments: 3 live sequences, sinks, the new rows as keys
        assert seen["num_seqs"] == 3 and seen["sinks"] and seen["window"] == 5
        assert np.array_equal(seen["keys"][:6], case["keys"][:6].numpy())
