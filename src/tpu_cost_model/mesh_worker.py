"""The mesh side of the TPU worker: an MoE layer expert-parallel over an 8-chip mock TPU slice, compiled by libtpu,
beside the same layer on one chip. Runs in the TPU environment (worker.py's "mesh" mode), never in the main process.

Per (generation, model, phase, layout) one row:
  * compiled: `moe_experts` lowered for the layout's mesh of the slice's devices (or one chip) and compiled
    (Mosaic compiles the Pallas kernels inside the shard_map); memory_analysis gives per-chip argument, temporary
    and output bytes; the whole model's MoE layers are the weights times the layer count plus one layer's
    temporaries and activations (layers run one at a time), against the chip's HBM (ici.py);
  * modeled: the kernels of the busiest device (schedule.py walks `moe_device_work` with that device's share of a
    uniform top-k routing and its own weight slices), XLA's ops around them as schedule.py counts them (unfused: an
    upper bound, XLA fuses the elementwise chain), and the dispatch scheme's collectives (moe/plan.py's collectives)
    over the ICI (ici.py).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from kernel_hub.tpu.chips import chip
from kernel_hub.tpu.target import topology_devices
from kernel_hub.tpu.worker_common import first_meaningful_line, memory_bytes, refuse

from .ici import collective_seconds, interconnect
from .schedule import ScheduleCost, kernel_cost
from .workload import load_moe_kernel, topk_routing

if TYPE_CHECKING:
    from types import ModuleType

    import jax
    import numpy.typing as npt
    from jax.sharding import PartitionSpec

    from kernel_hub.json_types import JsonDict
    from kernel_hub.tpu.worker_common import Emit

    from .workload import MoeGeometry

#: Layouts of the 8-chip slice: (name, expert-axis size, tensor-axis size); "1chip" is the single-device layer.
LAYOUTS = {"1chip": (1, 1), "ep8": (8, 1), "ep4xtp2": (4, 2)}


@contextlib.contextmanager
def slice_target(generation: str) -> Iterator[list[jax.Device]]:
    """The 8 devices of a mock TPU slice of `generation`, with the first as jax's default device (Pallas' TPU
    lowering reads its kind; the kernels' dispatch reads the platform from it or from the mesh)."""
    import jax

    devices = list(topology_devices(interconnect(generation).slice8))
    with jax.default_device(devices[0]):
        yield devices


def compile_layer(rd: ModuleType, geo: MoeGeometry, tokens: int, layout: str, dtype: str, devices: list[jax.Device],
                  capacity_factor: float | None, grad: bool = False) -> JsonDict:
    """Lower and compile one MoE layer for `layout` (grad: its backward, the gradients in x, topk_weights and the
    weights, as training runs it); per-chip memory from the compiler, or its refusal."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

    e, t = LAYOUTS[layout]
    h, i, n, k = geo.hidden, geo.intermediate, geo.experts, geo.top_k
    mesh, kw, specs = None, {}, [None] * 5
    if layout != "1chip":
        axes = ("expert",) if t == 1 else ("expert", "tensor")
        mesh = Mesh(np.array(devices).reshape((e,) if t == 1 else (e, t)), axes)
        kw = {"mesh": mesh, "expert_axis": "expert", "tensor_axis": None if t == 1 else "tensor",
              "capacity_factor": capacity_factor}
        scheme = rd.plan_dispatch(tokens, h, k, n, expert_devices=e, tensor_devices=t,
                                  itemsize=np.dtype(jnp.dtype(dtype)).itemsize, capacity_factor=capacity_factor)[0]
        specs = list(rd.partition_specs("expert", kw["tensor_axis"], scheme)[0])

    def place(shape: tuple[int, ...], d: npt.DTypeLike, spec: PartitionSpec | None) -> jax.ShapeDtypeStruct:
        sharding = SingleDeviceSharding(devices[0]) if mesh is None else NamedSharding(mesh, spec)
        return jax.ShapeDtypeStruct(shape, d, sharding=sharding)

    x, ids, w = place((tokens, h), dtype, specs[0]), place((tokens, k), jnp.int32, specs[1]), place(
        (tokens, k), jnp.float32, specs[2])
    down = place((n, i, h), dtype, specs[4])
    act = geo_activation(geo)
    if t == 1:
        fn = lambda x_, ids_, w_, gu, dn: rd.moe_experts(x_, ids_, w_, gu, dn, activation=act, **kw)
        args = (x, ids, w, place((n, h, 2 * i), dtype, specs[3]), down)
    else:  # a tensor split takes the (gate, up) pair
        fn = lambda x_, ids_, w_, g, u, dn: rd.moe_experts(x_, ids_, w_, (g, u), dn, activation=act, **kw)
        args = (x, ids, w, *(place((n, h, i), dtype, sp) for sp in specs[3]), down)
    if grad:  # the gradients in every operand but the ids
        compile_case = importlib.import_module(f"{rd.__name__}._vendor.compile_case")
        fn, args = compile_case.forward_or_grad(fn, args, True, tuple(a for a in range(len(args)) if a != 1))
    start = time.perf_counter()
    try:
        compiled = jax.jit(fn).lower(*args).compile()
    except Exception as exc:  # the compiler's refusal is the result
        return {"compiled": False, "error": first_meaningful_line(str(exc) or type(exc).__name__),
                "compile_seconds": time.perf_counter() - start}
    return {"compiled": True, "error": None, "compile_seconds": time.perf_counter() - start,
            **memory_bytes(compiled)}


def weight_bytes(geo: MoeGeometry, layout: str, dtype: str) -> int:
    """Expert weights one chip holds: E/e experts' [H, 2I/t] and [I/t, H] slices."""
    e, t = LAYOUTS[layout]
    itemsize = np.dtype(dtype).itemsize if dtype != "bfloat16" else 2
    return geo.experts // e * 3 * geo.hidden * geo.intermediate // t * itemsize


def geo_activation(geo: MoeGeometry) -> str:
    """Gemma's experts are GELU-gated (tanh approximation), the others SiLU-gated."""
    return "gelu" if geo.model.startswith("gemma") else "silu"


@functools.cache
def device_costs(rd: ModuleType, geo: MoeGeometry, tokens: int, layout: str, dtype: str,
                 capacity_factor: float | None) -> tuple[str, int, str, tuple[ScheduleCost, ...]]:
    """(scheme, rows, why, each device's ScheduleCost) of one layer: the schedule walk depends on no chip, so each
    (layer, layout) is walked once however many generations are modeled."""
    import jax
    import jax.numpy as jnp

    e, t = LAYOUTS[layout]
    h, i, n, k = geo.hidden, geo.intermediate, geo.experts, geo.top_k
    itemsize = np.dtype(jnp.dtype(dtype)).itemsize
    ids = topk_routing(tokens, n, k)
    weights = np.full((tokens, k), 1.0 / k, np.float32)
    el, il = n // e, i // t
    if layout == "1chip":
        scheme, rows, why = "none", tokens * k, "one chip: every row, nothing moves"
    else:
        scheme, rows, why = rd.plan_dispatch(tokens, h, k, n, expert_devices=e, tensor_devices=t, itemsize=itemsize,
                                             capacity_factor=capacity_factor)
    sds = jax.ShapeDtypeStruct
    costs = []
    for d in range(e):  # tensor slices of one expert group do the same work
        work = functools.partial(rd.moe_device_work, topk_ids=ids, topk_weights=weights, first_expert=d * el,
                                 rows=rows if scheme != "all_to_all" else None, activation=geo_activation(geo))
        if t == 1:
            cost = kernel_cost(lambda x, gu, dn, work=work: work(x, w_gate_up=gu, w_down=dn), sds((tokens, h), dtype),
                               sds((el, h, 2 * il), dtype), sds((el, il, h), dtype))
        else:  # the (gate, up) pair of a tensor split
            cost = kernel_cost(lambda x, g, u, dn, work=work: work(x, w_gate_up=(g, u), w_down=dn),
                               sds((tokens, h), dtype), sds((el, h, il), dtype), sds((el, h, il), dtype),
                               sds((el, il, h), dtype))
        costs.append(cost)
    return scheme, rows, why, tuple(costs)


def modeled_layer(rd: ModuleType, geo: MoeGeometry, tokens: int, layout: str, dtype: str, generation: str,
                  capacity_factor: float | None) -> JsonDict:
    """Modeled seconds of one layer on `generation`: the busiest device's kernels and glue, plus the collectives."""
    import jax.numpy as jnp

    e, t = LAYOUTS[layout]
    h, n, k = geo.hidden, geo.experts, geo.top_k
    itemsize = np.dtype(jnp.dtype(dtype)).itemsize
    scheme, rows, why, costs = device_costs(rd, geo, tokens, layout, dtype, capacity_factor)
    c = chip(generation)
    per_device = [(cost.seconds(c), sum(call.seconds(c) for call in cost.calls), cost) for cost in costs]
    total, kernels_s, cost = max(per_device, key=lambda p: p[0])
    sizes = rd.MoeSizes(tokens, h, k, n, e, t, itemsize)
    coll = [] if layout == "1chip" else rd.collectives(scheme, sizes, capacity_factor)
    bw = lat = 0.0
    for kind, group, sent in coll:
        b, lt = collective_seconds(kind, group, sent, generation)
        bw, lat = bw + b, lat + lt
    local, el = topk_routing(tokens, n, k).ravel(), n // e  # the routing device_costs walked
    return {
        "scheme": scheme, "rows": rows, "decision": why, "kernels_s": kernels_s,
        "glue_s": total - kernels_s, "collective_bandwidth_s": bw, "collective_latency_s": lat,
        "modeled_s": total + bw + lat, "collective_bytes": sum(s for _, _, s in coll),
        "collectives": [f"{kind} x{group} {sent / 2**10:.0f} KiB" for kind, group, sent in coll],
        "kernel_hbm_bytes": sum(call.hbm_bytes for call in cost.calls), "glue_bytes": cost.outside_bytes,
        "active_experts_busiest": int(max(len(set(local[(local >= d * el) & (local < (d + 1) * el)]))
                                          for d in range(e))),
    }


def run_mesh(request: JsonDict, emit: Emit) -> int:
    """Request: {"mode": "mesh", "ragged_dot" (a VerifiedPackage.request()), "generations", "models",
    "phases" {name: tokens} | null,
    "layouts" [names] | null, "capacity_factors" [null | float] | null, "layers" {model: n}, "dtype",
    "model_only": bool, "grad_layouts" [names] | null (also compile their backward)}. The model runs on the host
    CPU (schedule.py evaluates the routing concretely), the compile for the mock slice."""
    from kernel_hub.errors import KernelHubError

    try:
        rd, shapes, geos = load_moe_kernel(request["ragged_dot"])
    except KernelHubError as exc:
        return refuse(exc, emit)
    layers = request.get("layers") or {}
    phases = request.get("phases") or shapes.PHASES
    dtype = request.get("dtype", "bfloat16")
    for generation in request["generations"]:
        ici = interconnect(generation)
        for model in request["models"]:
            geo = geos[model]
            for phase, tokens in phases.items():
                for layout in request.get("layouts") or list(LAYOUTS):
                    for cf in request.get("capacity_factors") or [None]:
                        if cf is not None and layout == "1chip":
                            continue
                        emit({"event": "start", "generation": generation, "name": f"{model}:{phase}:{layout}:{cf}"})
                        row: JsonDict = {"generation": generation, "model": model, "phase": phase,
                                               "tokens": tokens, "layout": layout, "capacity_factor": cf,
                                               "dtype": dtype, "hbm_bytes": ici.hbm_bytes,
                                               "layers": layers.get(model),
                                               "weight_bytes": weight_bytes(geo, layout, dtype)}
                        row.update(modeled_layer(rd, geo, tokens, layout, dtype, generation, cf))
                        if not request.get("model_only"):
                            with slice_target(generation) as devices:
                                row.update(compile_layer(rd, geo, tokens, layout, dtype, devices, cf))
                                if layout in (request.get("grad_layouts") or ()):
                                    bwd = compile_layer(rd, geo, tokens, layout, dtype, devices, cf, grad=True)
                                    row.update({f"bwd_{k}": v for k, v in bwd.items()})
                        emit({"event": "row", **row})
    return 0
