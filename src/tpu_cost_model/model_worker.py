"""The cost-model side of the worker: our kernels' modeled time beside the ideal and XLA's own estimate.

Runs in the TPU environment (XLA's estimate needs libtpu). Rows:
  * one MoE layer (gate_up + down ragged dots) per model in the request, decode and prefill;
  * attention prefill (causal) and decode at one model's head geometry.
For each chip: modeled_s (schedule.py, from the kernel's own grid and index maps with a real routing),
ideal_s (each active expert's weights once plus activations / q, k, v, o once, at HBM bandwidth, or the useful
FLOPs at peak if that is longer), xla_estimate_s (compiled.cost_analysis()["optimal_seconds"] of
jax.lax.ragged_dot / jax.nn.dot_product_attention compiled for that chip).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import numpy as np

from kernel_hub.tpu.chips import chip
from kernel_hub.tpu.target import on_device, tpu_target
from kernel_hub.tpu.worker_common import load_package, refuse

from .schedule import ScheduleCost, kernel_cost
from .workload import ideal_seconds, load_moe_kernel, routing

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from kernel_hub.json_types import JsonDict
    from kernel_hub.tpu.worker_common import Emit

    from .peer_rows import PeerArg
    from .workload import HeadGeometry, MoeGeometry


def _xla_estimate(fn: Callable[..., object], args: tuple[PeerArg, ...], generation: str) -> float | None:
    import jax

    with tpu_target(generation) as device:
        compiled = jax.jit(fn).lower(*on_device(args, device)).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    value = (cost or {}).get("optimal_seconds")
    return float(value) if value is not None else None


def _row(kernel: str, shape: str, generation: str, cost: ScheduleCost, ideal_s: float, xla_s: float | None,
         extra: JsonDict) -> JsonDict:
    modeled = cost.seconds(chip(generation))
    return {
        "kernel": kernel, "shape": shape, "generation": generation, "modeled_s": modeled, "ideal_s": ideal_s,
        "xla_estimate_s": xla_s, "modeled_over_ideal": modeled / ideal_s,
        "hbm_bytes": cost.hbm_bytes, "outside_bytes": cost.outside_bytes, "flops": cost.flops,
        "steps": cost.steps, "calls": [f"{c.name} grid={c.grid}" for c in cost.calls], **extra,
    }


def moe_rows(rd: ModuleType, geo: MoeGeometry, phase: str, tokens: int, generations: list[str], dtype: str
             ) -> list[JsonDict]:
    """One MoE layer (gate_up then down) of `geo` over `tokens` tokens."""
    import jax
    import jax.numpy as jnp

    gs = routing(tokens, geo.experts, geo.top_k)
    item = np.dtype(jnp.dtype(dtype)).itemsize
    total = ScheduleCost()
    ideal_bytes = flops = 0.0
    xla_args = []
    tiles = []
    for _proj, m, k, n, g in geo.projections(tokens):
        lhs, rhs = jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((g, k, n), dtype)
        call = lambda a, b, s: rd.ragged_dot(a, b, s, implementation="pallas", interpret=False)
        cost = kernel_cost(call, lhs, rhs, gs)
        total.calls += cost.calls
        total.xla += cost.xla
        ideal_bytes += (int(np.count_nonzero(gs)) * k * n + m * k + m * n) * item
        flops += 2.0 * m * k * n
        xla_args.append((lhs, rhs, jax.ShapeDtypeStruct((g,), jnp.int32)))
        cfg = rd.default_config(m, k, n, g, dtype)
        tiles.append(f"{cfg.tm}x{cfg.tk}x{cfg.tn}")
    rows = []
    for gen in generations:
        xla = [_xla_estimate(lambda a, b, s: jax.lax.ragged_dot(a, b, s), args, gen) for args in xla_args]
        xla_s = None if any(x is None for x in xla) else sum(xla)
        rows.append(_row("ragged_dot moe layer", f"{geo.model} {phase} {tokens} tok", gen, total,
                         ideal_seconds(ideal_bytes, flops, chip(gen)), xla_s,
                         {"active_experts": int(np.count_nonzero(gs)), "tiles": tiles}))
    return rows


def attention_rows(fa: ModuleType, geo: HeadGeometry, phase: str, generations: list[str], dtype: str, *, tokens: int,
                   batch: int, cache: int) -> list[dict]:
    import jax
    import jax.numpy as jnp

    sds = jax.ShapeDtypeStruct
    item = np.dtype(jnp.dtype(dtype)).itemsize
    sinks = np.zeros((geo.hq,), np.float32) if geo.sinks else None
    extra = {} if sinks is None else {"sinks": sinks}
    if phase == "prefill":
        b, s = 1, tokens
        q, kv = sds((b, geo.hq, s, geo.d), dtype), sds((b, geo.hkv, s, geo.d), dtype)
        fn = lambda q_, k_, v_, *rest: fa.flash_attention(q_, k_, v_, causal=True, implementation="pallas",
                                                          interpret=False, **dict(zip(extra, rest, strict=True)))
        cost = kernel_cost(fn, q, kv, kv, *extra.values())
        pairs = s * (s + 1) / 2
        ideal_bytes = (2 * b * geo.hq * s * geo.d + 2 * b * geo.hkv * s * geo.d) * item
        flops = 4.0 * b * geo.hq * pairs * geo.d
        xla_args = (sds((b, s, geo.hq, geo.d), dtype), sds((b, s, geo.hkv, geo.d), dtype),
                    sds((b, s, geo.hkv, geo.d), dtype))
        xla_fn = lambda q_, k_, v_: jax.nn.dot_product_attention(q_, k_, v_, is_causal=True)
        shape = f"gqa {geo.hq}/{geo.hkv}x{geo.d} prefill {s} causal"
    else:
        b, s = batch, cache
        q, kv = sds((b, geo.hq, geo.d), dtype), sds((b, geo.hkv, s, geo.d), dtype)
        lens = np.full((b,), s, np.int32)
        fn = lambda q_, k_, v_, l_, *rest: fa.decode_attention(q_, k_, v_, l_, implementation="pallas",
                                                               interpret=False, **dict(zip(extra, rest, strict=True)))
        cost = kernel_cost(fn, q, kv, kv, lens, *extra.values())
        ideal_bytes = (2 * b * geo.hq * geo.d + 2 * b * geo.hkv * s * geo.d) * item
        flops = 4.0 * b * geo.hq * s * geo.d
        xla_args = (sds((b, 1, geo.hq, geo.d), dtype), sds((b, s, geo.hkv, geo.d), dtype),
                    sds((b, s, geo.hkv, geo.d), dtype))
        xla_fn = lambda q_, k_, v_: jax.nn.dot_product_attention(q_, k_, v_)
        shape = f"gqa {geo.hq}/{geo.hkv}x{geo.d} decode b{b} cache {s}"
    rows = []
    for gen in generations:
        rows.append(_row(f"flash_attention {phase}", shape, gen, cost, ideal_seconds(ideal_bytes, flops, chip(gen)),
                         _xla_estimate(xla_fn, xla_args, gen), {}))
    return rows


def run_model(request: JsonDict, emit: Emit) -> int:
    """Request: {"mode": "model", "ragged_dot": package, "flash_attention": package, "generations", "moe_models",
    "attention_model", "dtype"} (packages as VerifiedPackage.request(): imported through the verified loader);
    one "row" event per (workload, generation)."""
    from kernel_hub.errors import KernelHubError

    gens = list(request["generations"])
    dtype = request.get("dtype", "bfloat16")
    try:
        (rd, moe_shapes, moe), fa = load_moe_kernel(request["ragged_dot"]), load_package(request["flash_attention"])
    except KernelHubError as exc:
        return refuse(exc, emit)
    for name in request["moe_models"]:
        for phase, tokens in moe_shapes.PHASES.items():
            for row in moe_rows(rd, moe[name], phase, tokens, gens, dtype):
                emit({"event": "row", **row})
    shapes = importlib.import_module(f"{fa.__name__}._vendor.attention_shapes")
    geo = {g.model: g for g in shapes.ATTENTION_MODELS}[request["attention_model"]]
    for phase in ("prefill", "decode"):
        for row in attention_rows(fa, geo, phase, gens, dtype, tokens=shapes.PREFILL_TOKENS,
                                  batch=shapes.DECODE_BATCH, cache=shapes.DECODE_CACHE):
            emit({"event": "row", **row})
    return 0
