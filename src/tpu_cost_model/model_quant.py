"""The cost model's quantized rows: one MoE layer (gate_up + down) on int8 (per-channel scales) and fp8 (128x128
block scales) expert weights beside the same layer in bf16, from the kernels' own schedules (schedule.py).

Per (model, phase, format, chip), every format's tiles chosen for that chip (the bf16 row too, so its times can
differ from the main table's, which traces once with the conservative 16 MiB tiles): modeled_s; ideal_s =
max(bytes once / HBM bandwidth, useful FLOPs / peak), the bytes being each active expert's weights at their own
width (1 byte quantized) plus their scales, read once, plus the bf16 activations in and out; over_bf16 = modeled_s /
the bf16 layer's modeled_s. Decode targets: over_bf16 <= 0.55 and modeled / ideal <= 1.15.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kernel_hub.tpu.chips import chip
from kernel_hub.tpu.worker_common import refuse

from .schedule import ScheduleCost, kernel_cost
from .workload import ideal_seconds, load_moe_kernel, routing

if TYPE_CHECKING:
    from types import ModuleType

    from kernel_hub.json_types import JsonDict
    from kernel_hub.tpu.worker_common import Emit

    from .workload import MoeGeometry

#: Weight formats of the rows: (weight dtype, bytes a weight).
FORMATS = {"bf16": ("bfloat16", 2), "int8": ("int8", 1), "fp8": ("float8_e4m3fn", 1)}
DECODE_OVER_BF16 = 0.55
DECODE_OVER_IDEAL = 1.15


def _scale_elems(k: int, n: int, fmt: str) -> int:
    if fmt == "int8":
        return n
    if fmt == "fp8":
        return -(-k // 128) * -(-n // 128)
    return 0


def layer_cost(rd: ModuleType, geo: MoeGeometry, tokens: int, fmt: str, generation: str, dtype: str = "bfloat16"
               ) -> tuple[ScheduleCost, float, float]:
    """(schedule cost, ideal bytes, useful FLOPs) of one MoE layer of `geo` over `tokens` tokens in `fmt`, traced
    for `generation` (the kernels' default tiles are chosen for that chip's VMEM, as on the chip itself)."""
    import jax
    import jax.numpy as jnp

    gs = routing(tokens, geo.experts, geo.top_k)
    wdt, wbytes = FORMATS[fmt]
    act = np.dtype(jnp.dtype(dtype)).itemsize
    active = int(np.count_nonzero(gs))
    total, ideal_bytes, flops = ScheduleCost(), 0.0, 0.0
    for _proj, m, k, n, g in geo.projections(tokens):
        lhs, rhs = jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((g, k, n), wdt)
        if fmt == "bf16":
            cost = kernel_cost(lambda a, b, s: rd.ragged_dot(a, b, s, implementation="pallas", interpret=False),
                               lhs, rhs, gs, generation=generation)
        else:
            shape = (g, 1, n) if fmt == "int8" else (g, -(-k // 128), -(-n // 128))
            scale = jax.ShapeDtypeStruct(shape, jnp.float32)
            cost = kernel_cost(lambda a, b, sc, s: rd.ragged_dot(a, b, s, rhs_scale=sc, implementation="pallas",
                                                                 interpret=False), lhs, rhs, scale, gs,
                               generation=generation)
        total.calls += cost.calls
        total.xla += cost.xla
        ideal_bytes += active * (k * n * wbytes + _scale_elems(k, n, fmt) * 4) + (m * k + m * n) * act
        flops += 2.0 * m * k * n
    return total, ideal_bytes, flops


def quant_rows(rd: ModuleType, geo: MoeGeometry, phase: str, tokens: int, generations: list[str]) -> list[JsonDict]:
    """bf16, int8 and fp8 rows of one MoE layer, each with its ratio to the bf16 layer and to its own ideal."""
    rows = []
    for gen in generations:
        costs = {fmt: layer_cost(rd, geo, tokens, fmt, gen) for fmt in FORMATS}
        c = chip(gen)
        bf16_s = costs["bf16"][0].seconds(c)
        bf16_band = costs["bf16"][0].band(c)
        for fmt, (cost, ideal_bytes, flops) in costs.items():
            modeled, ideal = cost.seconds(c), ideal_seconds(ideal_bytes, flops, c)
            fast, slow = cost.band(c)
            rows.append({"kernel": "ragged_dot moe layer", "model": geo.model, "phase": phase, "tokens": tokens,
                         "format": fmt, "generation": gen, "modeled_s": modeled, "band_s": [fast, slow],
                         "ideal_s": ideal, "modeled_over_ideal": modeled / ideal, "over_bf16": modeled / bf16_s,
                         # the ratio at each end of the band, both layers with the same constants
                         "over_bf16_band": [fast / bf16_band[0], slow / bf16_band[1]],
                         "hbm_bytes": cost.hbm_bytes, "outside_bytes": cost.outside_bytes, "flops": cost.flops,
                         "steps": cost.steps, "calls": [f"{x.name} grid={x.grid}" for x in cost.calls]})
    return rows


def run_quant_model(request: JsonDict, emit: Emit) -> int:
    """Request: {"mode": "quant_model", "ragged_dot": package, "generations", "moe_models"}; one "row" event per
    (model, phase, format, generation)."""
    from kernel_hub.errors import KernelHubError

    try:
        rd, shapes, geos = load_moe_kernel(request["ragged_dot"])
    except KernelHubError as exc:
        return refuse(exc, emit)
    for name in request["moe_models"]:
        for phase, tokens in shapes.PHASES.items():
            for row in quant_rows(rd, geos[name], phase, tokens, list(request["generations"])):
                emit({"event": "row", **row})
    return 0
