"""Ragged paged attention beside the paged kernels a TPU server would use instead, read by the same cost model; runs in
the TPU env (peers_worker's rows).

Per geometry (Qwen3-30B-A3B, Gemma 4 26B-A4B's sliding and global layers) and phase (decode: 64 sequences of one
new token over 8192 positions; mixed: 60 such decode steps beside 4 prefill chunks of 496 tokens over 4096), pages of
128 tokens: ours (flash-attention-tpu's ragged_paged_attention), vLLM's RPA v3 (tpu-inference 0.32.0: its default
blocks and one alternative, the faster by the model if it compiles) and, at decode, jax's paged_attention (16 or 32
pages per compute block, likewise; it has no sliding window, so on Gemma's sliding layers it reads the whole 8k).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .peer_rows import OURS, Peer, best_legal, rows_for
from .rates import stream_bytes_per_s

if TYPE_CHECKING:
    from types import ModuleType

    from kernel_hub.json_types import JsonDict

    from .workload import AttentionShapes, HeadGeometry

PAGED_MODELS = ("qwen3_30b_a3b", "gemma4_26b_a4b_sliding", "gemma4_26b_a4b_global")
PAGE, BATCH, CACHE = 128, 64, 8192
PREFILLS, CHUNK, PREFILL_CONTEXT = 4, 496, 4096


def batch(phase: str) -> list[tuple[int, int]]:
    """(new tokens, length including them) per sequence, decode steps first (RPA v3's required order)."""
    decode = [(1, CACHE)] * (BATCH - (PREFILLS if phase == "mixed" else 0))
    return decode + ([(CHUNK, PREFILL_CONTEXT)] * PREFILLS if phase == "mixed" else [])


def _metadata(seqs: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    pps = CACHE // PAGE
    q_lens = np.array([q for q, _ in seqs], np.int32)
    return {"kv_lens": np.array([k for _, k in seqs], np.int32),
            "table": np.arange(len(seqs) * pps, dtype=np.int32).reshape(len(seqs), pps),
            "cu": np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)}


def ideal_cost(geo: HeadGeometry, seqs: list[tuple[int, int]], itemsize: int) -> tuple[float, float]:
    """(bytes, flops): each sequence's visible K/V read once, the new tokens' K/V written once (the cache update is
    part of the call), queries read and outputs written once; 4 flops per query-key pair per head dim (q.k and p.v),
    over the keys each query sees (causal, windowed)."""
    kv_bytes = flops = 0.0
    for q_len, kv_len in seqs:
        first = kv_len - q_len
        seen = [min(first + j + 1, geo.window or kv_len) for j in range(q_len)]
        reach = min(kv_len, (geo.window or kv_len) + q_len - 1)
        kv_bytes += 2 * reach * geo.hkv * geo.d * itemsize
        flops += 4.0 * geo.hq * geo.d * sum(seen)
    tokens = sum(q for q, _ in seqs)
    return kv_bytes + 2 * tokens * (geo.hq + geo.hkv) * geo.d * itemsize, flops


def paged_peers(fa: ModuleType, geo: HeadGeometry, phase: str, dtype: str, generation: str) -> list[Peer]:
    import jax

    sds = jax.ShapeDtypeStruct
    seqs = batch(phase)
    meta = _metadata(seqs)
    tokens, b = sum(q for q, _ in seqs), len(seqs)
    hq, hkv, d, window = geo.hq, geo.hkv, geo.d, geo.window
    scale = 1.0 / math.sqrt(d)
    pages = b * (CACHE // PAGE)
    cache = sds((pages, PAGE, hkv, d), dtype)
    args = (sds((tokens, hq, d), dtype), sds((tokens, hkv, d), dtype), sds((tokens, hkv, d), dtype), cache, cache,
            meta["kv_lens"], meta["table"], meta["cu"], np.int32(b))
    # the caller donates both caches, as a server does (and as RPA v3's own jit donates its cache)
    ours_fn = jax.jit(lambda *a: fa.ragged_paged_attention(*a, sm_scale=scale, sliding_window=window,
                                                           implementation="pallas", interpret=False),
                      donate_argnums=(3, 4))
    fa.last_tuning(clear=True)
    ours = Peer(OURS, ours_fn, args, detail="cache updated in place (caches donated), pages of 128",
                chose=lambda: fa.last_tuning(clear=True))
    peers = [ours, _rpa_v3(geo, seqs, meta, dtype, generation, scale)]
    if phase == "decode":
        peers.append(_jax_paged(geo, meta, dtype, generation, scale))
    return peers


def _rpa_v3(geo: HeadGeometry, seqs: list[tuple[int, int]], meta: dict[str, np.ndarray], dtype: str, generation: str,
            scale: float) -> Peer:
    import jax

    from .tpu_inference_peers import PeerUnavailable, as_chip, import_kernel

    name = "tpu-inference RPA v3"
    try:
        rpa = import_kernel("rpa_v3")
    except PeerUnavailable as exc:
        return Peer(name, None, refused=str(exc))
    sds = jax.ShapeDtypeStruct
    tokens, b = sum(q for q, _ in seqs), len(seqs)
    decodes = sum(1 for q, _ in seqs if q == 1)
    cache_shape = rpa.get_kv_cache_shape(b * (CACHE // PAGE), PAGE, geo.hkv, geo.d, jax.numpy.dtype(dtype))
    args = (sds((tokens, geo.hq, geo.d), dtype), sds((tokens, geo.hkv, geo.d), dtype),
            sds((tokens, geo.hkv, geo.d), dtype), sds(cache_shape, dtype), meta["kv_lens"], meta["table"].reshape(-1),
            meta["cu"], np.array([decodes, decodes, b], np.int32))

    def make(blocks: dict[str, int]) -> Callable[..., object]:
        def call(q, k, v, c, lens, pi, cu, dist):
            with as_chip(rpa, generation):
                return rpa.ragged_paged_attention(q, k, v, c, lens, pi, cu, dist, sm_scale=scale,
                                                  sliding_window=geo.window, vmem_limit_bytes=64 << 20, **blocks)
        return call

    cands = [("its default blocks", make({}))]
    if decodes == b:
        cands.append(("decode blocks bq 1, bkv 2048", make({"d_block_sizes": (1, 2048, 1, 2048)})))
    else:
        cands.append(("mixed blocks bq 128, bkv 1024", make({"m_block_sizes": (128, 1024, 128, 1024)})))
    peer = best_legal(name, cands, args, generation, tries=1)
    peer.detail += "; fused K/V cache (its layout), no sinks"
    return peer


def _jax_paged(geo: HeadGeometry, meta: dict[str, np.ndarray], dtype: str, generation: str, scale: float) -> Peer:
    import jax
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    sds = jax.ShapeDtypeStruct
    b = len(meta["kv_lens"])
    pages = sds((geo.hkv, b * (CACHE // PAGE), PAGE, geo.d), dtype)
    args = (sds((b, geo.hq, geo.d), dtype), pages, pages, meta["kv_lens"], meta["table"])
    cands = []
    for per_block in (16, 32):
        fn = lambda q_, k_, v_, l_, t_, n=per_block: paged_attention(q_ * scale, k_, v_, l_, t_,
                                                                     pages_per_compute_block=n)
        cands.append((f"{per_block} pages per compute block", fn))
    peer = best_legal("jax paged_attention", cands, args, generation, tries=1)
    peer.detail += "; decode only, no cache update, head-major pages" + (
        ", no sliding window (reads all 8k)" if geo.window else "")
    return peer


def paged_attention_rows(fa: ModuleType, shapes: AttentionShapes, generation: str, dtype: str) -> list[JsonDict]:
    """Every geometry x phase: ours and the peers, with ours / best peer (peer_rows.rows_for)."""
    import jax.numpy as jnp

    item = np.dtype(jnp.dtype(dtype)).itemsize
    geos = {g.model: g for g in shapes.ATTENTION_MODELS}
    rows = []
    for model in PAGED_MODELS:
        geo = geos[model]
        for phase in ("decode", "mixed"):
            seqs = batch(phase)
            nbytes, flops = ideal_cost(geo, seqs, item)
            ideal = lambda c, by=nbytes, fl=flops: max(by / stream_bytes_per_s(c), fl / c.bf16_flops_per_s)
            label = (f"{model} {geo.hq}/{geo.hkv}x{geo.d} " +
                     ("decode b64 8k" if phase == "decode" else f"mixed {PREFILLS}x{CHUNK} prefill + 60 decode"))
            rows += rows_for("ragged_paged_attention", label, paged_peers(fa, geo, phase, dtype, generation), ideal,
                             generation)
    return rows
