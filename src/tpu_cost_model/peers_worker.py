"""Our kernels beside the TPU kernels a user would pick instead, each read by the same cost model; runs in the TPU env.

Per workload (a MoE projection or an attention phase) and generation, one row per peer:
  * ragged dot: ours; jax's megablox gmm at its default tiling and at the best legal tiling of a sweep (by the
    model; legal = fits the chip's scoped VMEM, then compiled); Tokamax 0.0.12's Mosaic ragged dot (its refusal
    when it refuses the shape); jax.lax.ragged_dot (XLA's own cost_analysis optimal_seconds).
  * attention: ours; jax's flash_attention (no GQA, no sinks: K/V repeated to every query head), splash_attention
    (GQA as one MQA kernel per kv head, causal mask, sinks) at prefill; paged_attention and ragged_paged_attention
    at decode (no sinks).
Every peer call is also compiled by libtpu for the generation: `compiled` is "yes" or the compiler's first line.
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kernel_hub.tpu.chips import chip
from kernel_hub.tpu.target import tpu_target
from kernel_hub.tpu.worker_common import first_meaningful_line, load_package, refuse

from .peer_rows import OURS, Peer, _seconds, best_legal, holds_across_band, rows_for  # noqa: F401 (holds_across_band: public here)
from .rates import stream_bytes_per_s
from .schedule import kernel_cost
from .workload import routing

if TYPE_CHECKING:
    from types import ModuleType

    from kernel_hub.json_types import JsonDict
    from kernel_hub.tpu.worker_common import Emit

    from .peer_rows import PeerArg
    from .workload import AttentionShapes, HeadGeometry, MoeGeometry

# ------------------------------------------------------------------------------------------ ragged dot peers


def megablox_tilings(m: int, k: int, n: int, vmem_bytes: int) -> list[tuple[int, int, int]]:
    """Legal megablox tilings: tm a multiple of 128 up to M (M divisible by it), tk / tn multiples of 128 that
    divide K / N (or the whole dimension), whose double-buffered bf16 blocks plus f32 output and accumulator fit."""
    def sizes(dim: int) -> list[int]:  # the whole dim and the multiples of 128 dividing it from 512 up
        out = [t for t in (512, 768, 1024, 1536, 2048) if t < dim and dim % t == 0]
        return sorted(set(out + [dim]))
    tms = [t for t in (128, 256, 512) if t <= m and m % t == 0] or [m]
    legal = []
    for tm, tk, tn in itertools.product(tms, sizes(k), sizes(n)):
        vmem = 2 * 2 * (tm * tk + tk * tn) + 2 * 4 * tm * tn + 4 * tm * tn
        if vmem <= vmem_bytes:
            legal.append((tm, tk, tn))
    return legal


def ragged_peers(rd: ModuleType, m: int, k: int, n: int, g: int, gs: np.ndarray, dtype: str,
                 generation: str) -> list[Peer]:
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.megablox.gmm import gmm

    sds = jax.ShapeDtypeStruct
    args = (sds((m, k), dtype), sds((g, k, n), dtype), gs)
    out = jnp.dtype(dtype)
    tiles = importlib.import_module(f"{rd.__name__}.pallas.config")
    if hasattr(tiles, "choose_config"):  # the tiles ours picks on this chip (it reads the target's device kind)
        chips = importlib.import_module(f"{rd.__name__}._vendor.chips")
        cfg, why = tiles.choose_config(m, k, n, g, dtype, chip=chips.CHIPS.get(generation))
        detail = f"tiles {cfg.tm}x{cfg.tk}x{cfg.tn}, {cfg.experts_per_step} expert(s) per step: {why}"
    else:
        detail = "tiles {0.tm}x{0.tk}x{0.tn}".format(rd.default_config(m, k, n, g, dtype))
    peers = [Peer(OURS, lambda a, b, s: rd.ragged_dot(a, b, s, implementation="pallas", interpret=False), args,
                  detail=detail)]
    peers.append(Peer("megablox gmm (default 128x128x128)",
                      lambda a, b, s: gmm(a, b, s, preferred_element_type=out), args))
    vmem = 16 * 2**20 if generation == "v5e" else 32 * 2**20
    best, best_s = None, math.inf
    tilings = megablox_tilings(m, k, n, vmem)
    swept = len(tilings)
    for tiling in tilings:
        try:
            cost = kernel_cost(lambda a, b, s, t=tiling: gmm(a, b, s, preferred_element_type=out, tiling=t), *args,
                               generation=generation)
        except Exception:  # a tiling gmm itself refuses at trace
            continue
        if cost.seconds(chip(generation)) < best_s:
            best, best_s = tiling, cost.seconds(chip(generation))
    if best is not None:
        peers.append(Peer("megablox gmm (best of sweep)",
                          lambda a, b, s, t=best: gmm(a, b, s, preferred_element_type=out, tiling=t), args,
                          detail=f"tiling {best[0]}x{best[1]}x{best[2]} (best of {swept} legal)"))
    peers.append(_tpu_inference_gmm_peer(args, out, m, k, n, vmem, generation))
    peers.append(_tokamax_peer(m, k, n, g, gs, dtype))
    peers.append(Peer("jax.lax.ragged_dot (XLA)", lambda a, b, s: jax.lax.ragged_dot(a, b, s), args, xla=True))
    return peers


def _tpu_inference_gmm_peer(args: tuple[PeerArg, ...], out: np.dtype, m: int, k: int, n: int, vmem: int,
                            generation: str) -> Peer:
    """vLLM's megablox gmm (tpu-inference 0.32.0, installed) at the best legal tiling: its own tuned/default
    tiling and the same sweep as jax's megablox, each read by the model, the fastest that compiles kept."""
    from .tpu_inference_peers import PeerUnavailable, import_kernel

    name = "tpu-inference megablox gmm"
    try:
        ti = import_kernel("megablox_gmm")
    except PeerUnavailable as exc:
        return Peer(name, None, refused=str(exc))
    cands = [("its default tiling", lambda a, b, s: ti.gmm(a, b, s, preferred_element_type=out))]
    cands += [(f"tiling {t[0]}x{t[1]}x{t[2]}",
               lambda a, b, s, t=t: ti.gmm(a, b, s, preferred_element_type=out, tiling=t))
              for t in megablox_tilings(m, k, n, vmem)]
    return best_legal(name, cands, args, generation, tries=2)


def _tokamax_peer(m: int, k: int, n: int, g: int, gs: np.ndarray, dtype: str) -> Peer:
    import jax

    name = "tokamax mosaic ragged_dot"
    try:
        import tokamax
    except ImportError as exc:
        return Peer(name, None, refused=f"tokamax not installed: {exc}")
    sds = jax.ShapeDtypeStruct
    fn = lambda a, b, s: tokamax.ragged_dot(a, b, s, implementation="mosaic")
    try:  # it checks the shape when traced: a refusal is its one line
        jax.eval_shape(fn, sds((m, k), dtype), sds((g, k, n), dtype), sds((g,), np.int32))
    except Exception as exc:
        return Peer(name, None, refused="refused: " + first_meaningful_line(str(exc) or type(exc).__name__))
    return Peer(name, fn, (sds((m, k), dtype), sds((g, k, n), dtype), gs))


def moe_rows(rd: ModuleType, geo: MoeGeometry, phase: str, tokens: int, generation: str, dtype: str) -> list[JsonDict]:
    import jax.numpy as jnp

    gs = routing(tokens, geo.experts, geo.top_k)
    item = np.dtype(jnp.dtype(dtype)).itemsize
    rows = []
    for proj, m, k, n, g in geo.projections(tokens):
        active = int(np.count_nonzero(gs))
        bytes_ = (active * k * n + m * k + m * n) * item
        flops = 2.0 * m * k * n
        ideal = lambda c, b=bytes_, f=flops: max(b / stream_bytes_per_s(c), f / c.bf16_flops_per_s)
        shape = f"{geo.model} {proj} {phase} {tokens} tok (m={m} k={k} n={n})"
        rows += rows_for("ragged_dot", shape, ragged_peers(rd, m, k, n, g, gs, dtype, generation), ideal,
                         generation)
    return rows


# ------------------------------------------------------------------------------------------- attention peers



def _prefill_blocks(s: int) -> list[int]:
    return [t for t in (256, 512, 1024, 2048, 4096) if t <= s and s % t == 0]


def prefill_peers(fa: ModuleType, geo: HeadGeometry, s: int, dtype: str, generation: str) -> list[Peer]:
    """Ours at its default tiles; jax's flash_attention and splash_attention each at the best of a sweep over
    their block sizes (the default 128-blocks put them at tens of thousands of grid steps)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import flash_attention as jfa
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    sds = jax.ShapeDtypeStruct
    hq, hkv, d = geo.hq, geo.hkv, geo.d
    group = hq // hkv
    scale = 1.0 / math.sqrt(d)
    sinks = np.zeros((hq,), np.float32) if geo.sinks else None  # values the kernels may prefetch
    q, kv = sds((1, hq, s, d), dtype), sds((1, hkv, s, d), dtype)
    ours_args = (q, kv, kv) + ((sinks,) if sinks is not None else ())
    ours = Peer(OURS, lambda q_, k_, v_, *r: fa.flash_attention(q_, k_, v_, causal=True, sm_scale=scale,
                                                                 sinks=r[0] if r else None,
                                                                 implementation="pallas", interpret=False),
                ours_args, detail="sinks" if sinks is not None else "")
    blocks = _prefill_blocks(s)

    def jax_flash(bs):
        def call(q_, k_, v_):
            k_, v_ = jnp.repeat(k_, group, axis=1), jnp.repeat(v_, group, axis=1)  # no GQA: K/V for every head
            return jfa.flash_attention(q_, k_, v_, causal=True, sm_scale=scale, block_sizes=bs)
        return call

    flash_cands = []
    for bq, bkm, bk in itertools.product(blocks, blocks, blocks):
        if bk <= bkm and bkm % bk == 0 and bk <= 1024:
            bs = jfa.BlockSizes(block_q=bq, block_k_major=bkm, block_k=bk, block_b=1)
            flash_cands.append((f"blocks q {bq} k_major {bkm} k {bk}", jax_flash(bs)))

    mask = sm.MultiHeadMask([sm.CausalMask((s, s)) for _ in range(group)])

    def jax_splash(bs):
        with jax.default_device(jax.devices("cpu")[0]):  # its block-sparsity tables are built on the host
            splash = sk.make_splash_mqa_single_device(mask=mask, block_sizes=bs)

        def call(q_, k_, v_, *r):
            qg = (q_[0] * scale).reshape(hkv, group, s, d)
            if r:
                out = jax.vmap(lambda a, b, c, z: splash(a, b, c, sinks=z))(qg, k_[0], v_[0],
                                                                            r[0].reshape(hkv, group))
            else:
                out = jax.vmap(splash)(qg, k_[0], v_[0])
            return out.reshape(1, hq, s, d)
        return call

    splash_cands = []
    for bq, bkv, bkc in itertools.product(blocks, blocks, blocks):
        if bkc <= bkv and bkv % bkc == 0 and bkc <= 1024:
            bs = sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkc)
            splash_cands.append((f"blocks q {bq} kv {bkv} kv_compute {bkc}", jax_splash(bs)))
    flash = best_legal("jax flash_attention", flash_cands, (q, kv, kv), generation)
    flash.detail += "; no GQA (K/V repeated), no sinks"
    splash = best_legal("jax splash_attention", splash_cands, ours_args, generation)
    splash.detail += "; MQA kernel per kv head" + (", sinks" if sinks is not None else "")
    return [ours, flash, splash]


def decode_peers(fa: ModuleType, geo: HeadGeometry, b: int, cache: int, dtype: str, generation: str) -> list[Peer]:
    """Ours; jax's paged_attention and ragged_paged_attention each at the best of a sweep over page size and
    pages (and queries) per block."""
    import jax
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    sds = jax.ShapeDtypeStruct
    hq, hkv, d = geo.hq, geo.hkv, geo.d
    scale = 1.0 / math.sqrt(d)
    lens = np.full((b,), cache, np.int32)
    sinks = np.zeros((hq,), np.float32) if geo.sinks else None
    kvc = sds((b, hkv, cache, d), dtype)
    ours_args = (sds((b, hq, d), dtype), kvc, kvc, lens) + ((sinks,) if sinks is not None else ())
    ours = Peer(OURS, lambda q_, k_, v_, l_, *r: fa.decode_attention(q_, k_, v_, l_, sm_scale=scale,
                                                                      sinks=r[0] if r else None,
                                                                      implementation="pallas", interpret=False),
                ours_args, detail="sinks" if sinks is not None else "")
    peers = [ours]
    # both peers need head_dim % 128 == 0 (paged_attention's m/l output blocks, ragged_paged_attention's lane
    # broadcasts assert it): a user of theirs stores the cache zero-padded to 128, which they then read
    dp = -(-d // 128) * 128
    pad = f"head dim zero-padded {d} -> {dp}; " if dp != d else ""
    q_p = sds((b, hq, dp), dtype)
    best_paged = None
    for page in (128, 256):
        pages_per_seq = cache // page
        table = np.arange(b * pages_per_seq, dtype=np.int32).reshape(b, pages_per_seq)
        pages = sds((hkv, b * pages_per_seq, page, dp), dtype)
        cands = []
        for per_block in [n for n in (8, 16, 32) if pages_per_seq % n == 0] or [pages_per_seq]:
            fn = lambda q_, k_, v_, l_, t_, n=per_block: paged_attention(q_ * scale, k_, v_, l_, t_,
                                                                         pages_per_compute_block=n)
            cands.append((f"pages of {page}, {per_block} per block", fn))
        args = (q_p, pages, pages, lens, table)
        peer = best_legal("jax paged_attention", cands, args, generation)
        secs = _seconds(peer, args, generation)
        if best_paged is None or secs < best_paged[0]:
            best_paged = (secs, peer)
    best_paged[1].detail = pad + best_paged[1].detail + "; no sinks"
    peers.append(best_paged[1])
    best_rpa = None
    for page, kv_pages_set in ((128, (8, 16, 32, 64)), (256, (8, 16, 32))):
        pages_per_seq = cache // page
        table = np.arange(b * pages_per_seq, dtype=np.int32).reshape(b, pages_per_seq)
        args = (q_p, sds((b * pages_per_seq, page, 2 * hkv, dp), dtype), lens, table,
                np.arange(b + 1, dtype=np.int32), np.array([b], np.int32))
        cands = []
        kv_pages_set = [n for n in kv_pages_set if n <= pages_per_seq] or [pages_per_seq]
        for kv_pages, queries in itertools.product(kv_pages_set, (16, 64)):
            fn = lambda q_, kv_, l_, t_, cu_, n_, kp=kv_pages, nq=queries: ragged_paged_attention(
                q_, kv_, l_, t_, cu_, n_, sm_scale=scale, num_kv_pages_per_block=kp, num_queries_per_block=nq)
            cands.append((f"pages of {page}, {kv_pages} pages x {queries} queries per block", fn))
        peer = best_legal("jax ragged_paged_attention", cands, args, generation)
        secs = _seconds(peer, args, generation)
        if best_rpa is None or secs < best_rpa[0]:
            best_rpa = (secs, peer)
    best_rpa[1].detail = pad + best_rpa[1].detail + "; no sinks; explicit blocks (its tuned-table lookup asks " \
        "jax.devices()[0], the CPU host under a mock TPU: 'TPU version must be 4 or higher')"
    peers.append(best_rpa[1])
    peers.append(_rpa_v3_peer(geo, b, cache, dtype, generation, scale))
    return peers


def _rpa_v3_peer(geo: HeadGeometry, b: int, cache: int, dtype: str, generation: str, scale: float) -> Peer:
    """vLLM's ragged paged attention v3 (tpu-inference 0.32.0, installed) at decode, best legal decode blocks.
    Its main kernel stores the cache with the head dim padded to 128; its head-dim-64 kernel (kernel_hd64.py)
    imports tpu_inference.utils, which needs torchax and vllm (not installed): the row says so."""
    import jax

    from .tpu_inference_peers import PeerUnavailable, as_chip, import_kernel

    name = "tpu-inference RPA v3"
    try:
        rpa = import_kernel("rpa_v3")
    except PeerUnavailable as exc:
        return Peer(name, None, refused=str(exc))
    hd64 = ""
    try:
        import_kernel("rpa_v3_hd64")
    except PeerUnavailable as exc:
        hd64 = f"; head-dim-64 kernel not walked: {exc}"
    sds = jax.ShapeDtypeStruct
    hq, hkv, d = geo.hq, geo.hkv, geo.d
    dp = -(-d // 128) * 128
    packing = 4 // np.dtype(jax.numpy.dtype(dtype)).itemsize
    page = 128
    pages_per_seq = cache // page
    args = (sds((b, hq, d), dtype), sds((b, hkv, d), dtype), sds((b, hkv, d), dtype),
            sds((b * pages_per_seq, page, 2 * hkv // packing, packing, dp), dtype),
            np.full((b,), cache, np.int32), np.arange(b * pages_per_seq, dtype=np.int32),
            np.arange(b + 1, dtype=np.int32), np.array([b, b, b], np.int32))

    def make(blocks: tuple[int, int, int, int] | None) -> Callable[..., object]:
        def call(q, k, v, c, lens, pi, cu, dist):
            with as_chip(rpa, generation):
                return rpa.ragged_paged_attention(q, k, v, c, lens, pi, cu, dist, sm_scale=scale,
                                                  d_block_sizes=blocks)
        return call

    cands = [("its default decode blocks", make(None))]
    cands += [(f"decode blocks bq 1, bkv {t}", make((1, t, 1, t))) for t in (1024, 2048, 4096, 8192) if t <= cache]
    peer = best_legal(name, cands, args, generation, tries=2)
    peer.detail += f"; cache head dim padded {d} -> {dp}; no sinks" + hd64
    return peer


def attention_rows(fa: ModuleType, geo: HeadGeometry, shapes: AttentionShapes, generation: str, dtype: str
                   ) -> list[JsonDict]:
    import jax.numpy as jnp

    item = np.dtype(jnp.dtype(dtype)).itemsize
    hq, hkv, d, s = geo.hq, geo.hkv, geo.d, shapes.PREFILL_TOKENS
    b, cache = shapes.DECODE_BATCH, shapes.DECODE_CACHE
    pre_bytes = (2 * hq * s * d + 2 * hkv * s * d) * item
    pre_flops = 4.0 * hq * s * (s + 1) / 2 * d
    dec_bytes = (2 * b * hq * d + 2 * b * hkv * cache * d) * item
    dec_flops = 4.0 * b * hq * cache * d
    ideal = lambda by, fl: lambda c: max(by / stream_bytes_per_s(c), fl / c.bf16_flops_per_s)
    return [*rows_for("flash_attention prefill", f"gqa {hq}/{hkv}x{d} prefill {s} causal",
                      prefill_peers(fa, geo, s, dtype, generation), ideal(pre_bytes, pre_flops), generation),
            *rows_for("flash_attention decode", f"gqa {hq}/{hkv}x{d} decode b{b} cache {cache}",
                      decode_peers(fa, geo, b, cache, dtype, generation), ideal(dec_bytes, dec_flops),
                      generation)]


def run_peers(request: JsonDict, emit: Emit) -> int:
    """Request: {"mode": "peers", "ragged_dot": package, "flash_attention": package, "generations", "moe_models",
    "attention_model", "dtype", "phases": {"decode": 64, ...} | null, "kernels": ["ragged_dot", "attention",
    "paged_attention"]};
    one "row" event per (workload, peer, generation)."""
    from kernel_hub.errors import KernelHubError

    dtype = request.get("dtype", "bfloat16")
    try:
        rd, fa = load_package(request["ragged_dot"]), load_package(request["flash_attention"])
    except KernelHubError as exc:
        return refuse(exc, emit)
    moe_shapes = importlib.import_module(f"{rd.__name__}._vendor.moe_shapes")
    shapes = importlib.import_module(f"{fa.__name__}._vendor.attention_shapes")
    moe = {g.model: g for g in moe_shapes.MOE_MODELS}
    for extra in request.get("moe_geometries") or ():  # small geometries for an end-to-end check (tests)
        moe[extra["model"]] = moe_shapes.MoeGeometry(**extra)
    phases = request.get("phases") or moe_shapes.PHASES
    kernels = request.get("kernels") or ["ragged_dot", "attention"]
    for gen in request["generations"]:
        with tpu_target(gen):
            _generation_rows(rd, fa, moe, phases, kernels, shapes, request, gen, dtype, emit)
    return 0


def _generation_rows(rd: ModuleType, fa: ModuleType, moe: JsonDict, phases: dict[str, int], kernels: list[str],
                     shapes: AttentionShapes, request: JsonDict, gen: str, dtype: str, emit: Emit) -> None:
    if True:
        if "ragged_dot" in kernels:
            for name in request["moe_models"]:
                for phase, tokens in phases.items():
                    for row in moe_rows(rd, moe[name], phase, int(tokens), gen, dtype):
                        emit({"event": "row", **row})
        if "paged_attention" in kernels:
            from .paged_peers import paged_attention_rows

            for row in paged_attention_rows(fa, shapes, gen, dtype):
                emit({"event": "row", **row})
        if "attention" in kernels:
            geo = {g.model: g for g in shapes.ATTENTION_MODELS}[request["attention_model"]]
            override = request.get("attention_shapes_override")
            for row in attention_rows(fa, geo, _Shapes(**override) if override else shapes, gen, dtype):
                emit({"event": "row", **row})


@dataclass(frozen=True)
class _Shapes:
    """Smaller attention shapes for a quick end-to-end check (tests)."""

    PREFILL_TOKENS: int
    DECODE_BATCH: int
    DECODE_CACHE: int
