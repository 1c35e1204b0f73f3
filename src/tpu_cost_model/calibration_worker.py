"""Each calibration row's kernel modeled at its shapes, in the TPU environment: our walker (schedule.py) on the
measured kernel's own code as installed (jax's Pallas ops, tpu-inference 0.32.0; the tutorial's matmul variants
rewritten in tutorial_matmul.py; XLA's own matmul read from its jaxpr by the XLA op rule) or, for the grouped
matmuls newer than any installable wheel, as read from the peer source the bench was given (calibration_peers.py),
else the reason it cannot be.

One "row" event per table row: device_s (the model's device time on the row's chip at the points of its constants'
bands, or None), band_s (fast, slow) and how (the kernel's calls and steps, or the one line saying why it was not
modeled). A row whose measurement is the kernel alone (scope "kernel") is modeled by its pallas_calls only. The
modeled-vs-measured comparison happens in calibration.compare, so the harness's dispatch stays out of the model.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from kernel_hub.tpu.chips import chip
from kernel_hub.tpu.target import tpu_target
from kernel_hub.tpu.worker_common import first_meaningful_line

from .calibration_peers import gmm_v2_row, hf_experts_row
from .ici import STEP_LATENCY_S, collective_seconds, interconnect
from .peer_source import load_peer, peer_shims, provenance
from .rates import stream_bytes_per_s
from .schedule import ScheduleCost, kernel_cost
from .workload import load_moe_kernel, routing
from .xla_compiled import side_by_side, with_compiled_xla

if TYPE_CHECKING:
    from types import ModuleType

    from kernel_hub.json_types import JsonDict
    from kernel_hub.tpu.chips import Chip
    from kernel_hub.tpu.worker_common import Emit

    from .workload import MoeGeometry


def _matmul(row: JsonDict) -> tuple[Any, tuple[Any, ...]]:
    """jax's Pallas matmul at the row's tiles, or the tutorial variant the row names (transpose_rhs: y given as
    [n, k])."""
    import jax
    from jax.experimental.pallas.ops.tpu.matmul import matmul

    from .tutorial_matmul import timed

    s = row["shapes"]
    bm, bk, bn = s["bm"], s["bk"], s["bn"]
    variant = s.get("variant")
    y_shape = (s["n"], s["k"]) if variant == "transpose_rhs" else (s["k"], s["n"])
    args = (jax.ShapeDtypeStruct((s["m"], s["k"]), row["dtypes"]["x"]),
            jax.ShapeDtypeStruct(y_shape, row["dtypes"]["y"]))
    if variant:
        return timed(variant, bm, bk, bn), args
    return (lambda x, y: matmul(x, y, block_shape=(bm, bn), block_k=bk)), args


def _xla_matmul(row: JsonDict) -> tuple[Any, tuple[Any, ...]]:
    """XLA's own matmul (jnp.matmul) at the row's shapes, dtypes and precision."""
    import jax
    import jax.numpy as jnp

    s, dt = row["shapes"], row["dtypes"]
    precision = s.get("precision")
    args = (jax.ShapeDtypeStruct((s["m"], s["k"]), dt["x"]), jax.ShapeDtypeStruct((s["k"], s["n"]), dt["y"]))
    return (lambda x, y: jnp.matmul(x, y, precision=precision)), args


def _rpa_v3(row: JsonDict) -> tuple[Any, tuple[Any, ...]]:
    """tpu-inference's RPA v3, pages in order. Decode (q_len 1): every sequence one new token over kv_len cached
    ones. Prefill (q_len = kv_len): each sequence's q_len tokens attend causally to themselves, sent as vLLM's TPU
    runner sends them (mixed), at the row's block sizes."""
    import jax

    from .tpu_inference_peers import as_chip, import_kernel

    rpa = import_kernel("rpa_v3")
    s, dt = row["shapes"], row["dtypes"]["kv_cache"]
    b, hq, hkv, d, page, kv_len = s["seqs"], s["q_heads"], s["kv_heads"], s["head_dim"], s["page_size"], s["kv_len"]
    q_len = s.get("q_len", 1)
    packing = 4 // np.dtype(jax.numpy.dtype(dt)).itemsize
    pages_per_seq = -(-kv_len // page)
    sds = jax.ShapeDtypeStruct
    tokens = b * q_len
    dist = np.array([b, b, b] if q_len == 1 else [0, 0, b], np.int32)
    args = (sds((tokens, hq, d), dt), sds((tokens, hkv, d), dt), sds((tokens, hkv, d), dt),
            sds((b * pages_per_seq, page, 2 * hkv // packing, packing, d), dt),
            np.full((b,), kv_len, np.int32), np.arange(b * pages_per_seq, dtype=np.int32),
            np.arange(b + 1, dtype=np.int32) * q_len, dist)
    scale = 1.0 / math.sqrt(d)
    blocks = {"m_block_sizes": tuple(s["blocks"])} if s.get("blocks") else {}

    def call(q, k, v, c, lens, pi, cu, dist):
        with as_chip(rpa, row["chip"]):
            return rpa.ragged_paged_attention(q, k, v, c, lens, pi, cu, dist, sm_scale=scale, **blocks)
    return call, args


def _splash(row: JsonDict) -> tuple[Any, tuple[Any, ...]]:
    """jax's splash attention as the row's caller ran it (axlearn's tpu_flash_attention): q scaled and q, k, v
    [B, S, H, D] transposed to [B, H, S, D] outside the kernel, make_splash_mha with the row's mask (a causal
    LocalMask of `window` positions back, or CausalMask) and block sizes, vmapped over the batch, the output
    transposed back."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    s, dt = row["shapes"], row["dtypes"]["q"]
    b, seq, h, d, block = s["batch"], s["seq"], s["heads"], s["head_dim"], s["block"]
    shape = (seq, seq)
    one = (sm.LocalMask(shape, window_size=(s["window"], 0), offset=0) if s.get("window")
           else sm.CausalMask(shape))
    sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block)
    with jax.default_device(jax.devices("cpu")[0]):  # its block-sparsity tables are built on the host
        kernel = jax.vmap(sk.make_splash_mha(mask=sm.MultiHeadMask([one] * h), block_sizes=sizes, head_shards=1,
                                             q_seq_shards=1))
    scale = d ** -0.5

    def call(q, k, v):
        heads_first = lambda x: jnp.einsum("btnh->bnth", x)
        return jnp.einsum("bnth->btnh", kernel(heads_first(q * scale), heads_first(k), heads_first(v)))
    arg = jax.ShapeDtypeStruct((b, seq, h, d), dt)
    return call, (arg, arg, arg)


def _tokamax_attention(row: JsonDict) -> tuple[Any, tuple[Any, ...]]:
    """Tokamax's Mosaic TPU flash attention op (PallasMosaicTpuFlashAttention, installed) at the row's cached
    config, called as its autotuner times it: the op itself, so the scale, the [B, T, H, D] -> [B, H, T, D]
    transposes, each SEQ_MINOR operand's extra transpose, the vmap over the batch and the output transpose are
    all in the program, as they were in the measured jitted call."""
    import jax
    from tokamax._src.ops.attention import pallas_mosaic_tpu as tk
    from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_kernel as splash

    s, dt = row["shapes"], row["dtypes"]
    c = dict(s["config"])
    for name in ("q_layout", "k_layout", "v_layout"):  # the cache stores the enum's value
        c[name] = splash.QKVLayout(c[name])
    op = tk.PallasMosaicTpuFlashAttention(config=tk.Config(**c))

    def call(q, k, v):
        return op(q, k, v, is_causal=s["causal"], logits_scale=s["logits_scale"], logits_dtype=dt["logits"],
                  return_residuals=s["return_residuals"])
    sds = jax.ShapeDtypeStruct
    return call, tuple(sds(tuple(s[n]), dt[n]) for n in ("q", "k", "v"))


def tokamax_group_sizes(spec: list[int] | JsonDict) -> np.ndarray:
    """A cache key's group sizes: the list it holds, or, for a key that holds only their count and total, the
    sizes its autotuner ran: it rebuilds such a key's sizes as `total` rows each given a group uniformly at
    random by numpy's default generator seeded 0 (tokamax ragged_dot/base.py, GroupSizes from a total), which
    this redraws; an even split would leave out the part-filled tile each group's remainder costs."""
    if isinstance(spec, list):
        return np.asarray(spec, np.int32)
    g, total = spec["num_groups"], spec["total_size"]
    picks = np.random.default_rng(0).choice(g, (total,), replace=True)
    return np.bincount(picks, minlength=g).astype(np.int32)


def _tokamax_ragged_dot(row: JsonDict) -> tuple[Any, tuple[Any, ...]]:
    """Tokamax's Mosaic TPU ragged dot op (PallasMosaicTpuRaggedDot, installed) at the row's cached config and
    dimension numbers, called as its autotuner times it: the op itself, so the group metadata XLA computes from
    the sizes, the transpose in front of the tgmm kernel and a residual output are in the program too."""
    import jax
    from tokamax._src.ops.ragged_dot import pallas_mosaic_tpu as tk

    s, dt = row["shapes"], row["dtypes"]
    d = s["ragged_dot_dimension_numbers"]
    (lc, rc), (lb, rb) = d["dot_dimension_numbers"]
    dims = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=((lc, rc), (lb, rb)),
                                             lhs_ragged_dimensions=d["lhs_ragged_dimensions"],
                                             rhs_group_dimensions=d["rhs_group_dimensions"])
    op = tk.PallasMosaicTpuRaggedDot(config=tk.Config(**s["config"]))

    def call(lhs, rhs, group_sizes):
        return op(lhs, rhs, group_sizes=group_sizes, ragged_dot_dimension_numbers=dims,
                  return_residuals=s["return_residuals"])
    sds = jax.ShapeDtypeStruct
    return call, (sds(tuple(s["lhs"]), dt["lhs"]), sds(tuple(s["rhs"]), dt["rhs"]),
                  tokamax_group_sizes(s["group_sizes"]))


#: The arguments a kind's caller donates: RPA writes the new keys and values into its cache in place.
_DONATED = {"rpa_v3": (3,)}


#: The kinds whose kernel is read from peer source (peer_source.PEER_FILES key), and how each row is built.
_PEER_KINDS = {"gmm_v2": ("tpu_inference_gmm_v2", gmm_v2_row), "hf_ragged_dot_tpu": ("tokamax_gmm_v2", hf_experts_row)}


def _not_modeled(row: JsonDict, peers: JsonDict) -> str | None:
    """Why a row's kernel is not walked here (None: it is)."""
    kind = row["kernel"]
    if kind == "gmm_v2" and "tpu_inference_gmm_v2" not in peers:
        return ("tpu-inference 0.32.0 ships no megablox gmm_v2 (the measured kernel is newer): give its source with "
                "bench/tpu_calibration.py --peer-source DIR (a tpu-inference checkout or mirror)")
    if kind == "hf_ragged_dot_tpu" and "tokamax_gmm_v2" not in peers:
        return ("tokamax 0.0.12 (the newest installable with jax 0.10.2) has no implementation='mosaic_tpu_v2': give "
                "Tokamax's gmm_v2 source with bench/tpu_calibration.py --peer-source DIR (a tokamax checkout or "
                "mirror)")
    return None


def _build(row: JsonDict, peers: JsonDict) -> tuple[Any, tuple[Any, ...]]:
    """The row's function and arguments: jax's or tpu-inference 0.32.0's kernels as installed, or a peer's read
    from the source the bench was given."""
    if row["kernel"] in _PEER_KINDS:
        key, builder = _PEER_KINDS[row["kernel"]]
        return builder(row, load_peer(peers, key))
    builders = {"pallas_matmul": _matmul, "rpa_v3": _rpa_v3, "xla_matmul": _xla_matmul, "splash_attention": _splash,
                "tokamax_flash_attention": _tokamax_attention, "tokamax_ragged_dot": _tokamax_ragged_dot}
    return builders[row["kernel"]](row)


def _peer_note(row: JsonDict, peers: JsonDict, shims: list[str]) -> JsonDict:
    """The peer source a row's kernel was read from, and the stand-ins for jax APIs it needed."""
    if row["kernel"] not in _PEER_KINDS:
        return {}
    source = peers[_PEER_KINDS[row["kernel"]][0]]
    used = [s for s in shims if s.split(" ->")[0].rsplit(".", 1)[-1] in source["text"]]  # those its code names
    return {"peer_source": provenance(source), "shims": used}


def uncalibrated_seconds(cost: ScheduleCost, c: Chip) -> float:
    """The model before calibration (spec bandwidth, steps added to the bound, every f32 dot at six passes, XLA ops
    as their bytes or FLOPs at peak, nothing removed), kept only to show what changed."""
    total = sum(max(op.bytes / c.hbm_bytes_per_s, sum(op.dots.values()) / c.bf16_flops_per_s) for op in cost.xla)
    for k in cost.calls:
        six = sum(f * (6 if "float32" in key[:2] else 1) for key, f in k.dots.items())
        total += max(k.hbm_bytes / c.hbm_bytes_per_s, six / c.bf16_flops_per_s) + k.steps * 0.35e-6
    return total


def model_row(row: JsonDict, peers: JsonDict | None = None) -> JsonDict:
    """One row modeled: device_s (the calibrated model's device time on the row's chip, None where it is not
    modeled), uncalibrated_s, and how (the calls and their totals, or the one line saying why not); `peers`: the
    peer kernels' source the bench read (peer_source.read_peer_sources), with the rows modeled on it naming it."""
    peers = peers or {}
    out: JsonDict = {"id": row["id"], "device_s": None, "uncalibrated_s": None}
    why = _not_modeled(row, peers)
    if why is not None:
        return {**out, "how": why}
    c = chip(row["chip"])
    if row["kernel"] == "streamed_copy":  # a bandwidth: the model's streamed-copy bandwidth on the chip
        lo, hi = (stream_bytes_per_s(c, end) for end in ("slow", "fast"))
        return {**out, "modeled_bytes_per_s": stream_bytes_per_s(c), "band_bytes_per_s": [lo, hi],
                "how": "the model's streamed-copy bandwidth (spec HBM x its stream fraction)"}
    if row["kernel"] == "collective_permute":
        return {**out, **_permute(row)}
    with peer_shims() as shims:
        try:
            with tpu_target(row["chip"]):
                fn, args = _build(row, peers)
                cost = kernel_cost(fn, *args, generation=row["chip"])
        except Exception as exc:  # Unmodeled names the primitive; an import failure names the module
            why = first_meaningful_line(str(exc) or type(exc).__name__)
            return {**out, "how": why, **_peer_note(row, peers, shims)}
        if row.get("scope") == "kernel":  # the measurement is the kernel alone: XLA's ops around it are not in it
            cost, rule, jaxpr_s = ScheduleCost(calls=cost.calls, notes=cost.notes), "none (the kernel alone)", None
        else:
            jaxpr_s = cost.seconds(c)
            with tpu_target(row["chip"]):
                cost, rule = with_compiled_xla(cost, fn, args, row["chip"], _DONATED.get(row["kernel"], ()))
    out.update(jaxpr_device_s=jaxpr_s, xla_rule=rule, **_peer_note(row, peers, shims))
    calls = ", ".join(f"{k.name} grid={k.grid}" for k in cost.calls)
    xla = "; ".join(cost.outside_ops)
    removed = "; ".join(cost.removed_ops)
    how = (f"{calls + '; ' if calls else ''}{cost.steps} steps, {cost.hbm_bytes / 2**20:.1f} MiB, {cost.flops:.3g} FLOP"
           + (f"; xla: {xla}" if xla else "") + (f"; removed: {removed}" if removed else ""))
    return {**out, "device_s": cost.seconds(c), "band_s": list(cost.band(c)),
            "uncalibrated_s": uncalibrated_seconds(cost, c), "hbm_bytes": cost.hbm_bytes, "flops": cost.flops,
            "steps": cost.steps, "scalar_ops": sum(k.scalar_ops for k in cost.calls),
            "eup_elems": sum(k.eup_elems for k in cost.calls), "vpu_elems": sum(k.vpu_elems for k in cost.calls),
            "stages": sum(k.stages for k in cost.calls), "how": how}


def _permute(row: JsonDict) -> JsonDict:
    """A collective permute row by the ICI model (ici.collective_seconds: no program to walk); uncalibrated_s is the
    payload at the links' spec rate plus one assumed step latency."""
    s = row["shapes"]
    at = lambda end: sum(collective_seconds("collective_permute", s["devices"], s["bytes"], row["chip"], end))
    ici = interconnect(row["chip"])
    spec = s["bytes"] / (ici.bidirectional_bytes_per_s / (2 * ici.ports)) + STEP_LATENCY_S
    return {"device_s": at(None), "band_s": [at("fast"), at("slow")], "uncalibrated_s": spec,
            "hbm_bytes": 0, "flops": 0, "steps": 1, "scalar_ops": 0,
            "how": f"ici.collective_seconds: {s['bytes'] / 2**20:.3g} MiB over one link at "
                   f"{ici.link_bytes_per_s / 1e9:.1f} GB/s + the collective's fixed cost"}


def ours_at_hf_shapes(rd: ModuleType, geo: MoeGeometry, row: JsonDict) -> JsonDict:
    """Our ragged dot (gate_up then down) modeled at an HF ragged-dot-tpu row's shapes: one EP rank holding
    local_experts of the model's experts, every token's top-k rows given (rows routed elsewhere past the local
    groups' sum, as an expert-parallel caller passes them), one uniform top-k routing."""
    import jax


    s = row["shapes"]
    tokens, local = s["tokens"], s["local_experts"]
    gs = routing(tokens, geo.experts, geo.top_k)[:local]
    c = chip(row["chip"])
    total, weights = 0.0, 0
    for _proj, m, k, n, _g in geo.projections(tokens):
        sds = jax.ShapeDtypeStruct
        fn = lambda a, b, g: rd.ragged_dot(a, b, g, implementation="pallas", interpret=False)
        total += kernel_cost(fn, sds((m, k), "bfloat16"), sds((local, k, n), "bfloat16"), gs,
                             generation=row["chip"]).seconds(c)
        weights += int(np.count_nonzero(gs)) * k * n * 2
    return {"id": row["id"], "tokens": tokens, "local_rows": int(gs.sum()), "active_local_experts":
            int(np.count_nonzero(gs)), "ours_device_s": total, "ideal_s": weights / stream_bytes_per_s(c),
            "measured_s": row["measured_s"]}


def show_row(row: JsonDict, hlo: bool = False, peers: JsonDict | None = None) -> str:
    """What the model reads and charges for one row's kernel (schedule.explain), or why it is not modeled."""
    from .schedule import explain

    peers = peers or {}
    why = _not_modeled(row, peers)
    if why is not None or row["kernel"] == "streamed_copy":
        return why or "a bandwidth, not a program"
    if row["kernel"] == "collective_permute":
        return _permute(row)["how"]
    with peer_shims(), tpu_target(row["chip"]):
        fn, args = _build(row, peers)
        text = explain(fn, *args, generation=row["chip"], hlo=hlo)
        walked = kernel_cost(fn, *args, generation=row["chip"])
        both, rule = with_compiled_xla(walked, fn, args, row["chip"], _DONATED.get(row["kernel"], ()))
    c = chip(row["chip"])
    compiled = both.xla if rule == "compiled" else None
    return "\n".join([text, side_by_side(walked.xla, compiled, c), f"XLA ops charged by: {rule}",
                      f"modeled on {row['chip']} with the compiled program's XLA ops: {both.seconds(c) * 1e6:.2f} us"])


def run_calibration(request: JsonDict, emit: Emit) -> int:
    """Request: {"mode": "calibration", "rows": [table rows], "ragged_dot": package | absent, "show": bool,
    "hlo": bool, "peer_sources": peer_source.read_peer_sources(...) | absent}; one "row" event per row (with
    "show", one "show" event per row: the program the model reads and what it charges), and with our ragged dot
    package one "ours_hf" event per HF ragged-dot-tpu row."""
    peers = request.get("peer_sources") or {}
    if request.get("show"):
        for row in request["rows"]:
            emit({"event": "show", "id": row["id"], "text": show_row(row, bool(request.get("hlo")), peers)})
        return 0
    for row in request["rows"]:
        emit({"event": "row", **model_row(row, peers)})
    if request.get("ragged_dot"):

        rd, _shapes, geos = load_moe_kernel(request["ragged_dot"])
        for row in request["rows"]:
            if row["kernel"] == "hf_ragged_dot_tpu":
                with tpu_target(row["chip"]):
                    emit({"event": "ours_hf", **ours_at_hf_shapes(rd, geos["qwen3_30b_a3b"], row)})
    return 0
