"""The decode-step side of the TPU worker (worker.py's "decode" mode): a seed model's whole decode step compiled by
libtpu for a mock 8-device slice and modeled op by op. Runs in the TPU environment, never in the main process.

Per (model, batch, cache, generation, path) one row:
  * compiled (unless model_only): decode_step.decode_step jitted whole (lax.scan over layer groups, the caches
    donated) on ShapeDtypeStructs with NamedShardings over the slice's 8 devices, lowered and compiled; the
    compiler's per-device argument / temporary / output / alias bytes and the compile seconds;
  * modeled: schedule.kernel_cost walks one layer group with the embedding + LM head, and those alone, on device 0
    (the kernels' grids, each XLA op by its rule), with a uniform top-k routing given concretely; the step is
    ends + groups x (group with ends - ends); the
    collectives (the attention's and shared MLP's all-reduces, the experts' dispatch from the ragged-dot package's
    plan, the embedding's all-reduce and the LM head's all-gather) by ici.collective_seconds. The band is the
    schedule's constant bands (ScheduleCost.band), with each collective's fixed cost at the same end of its band.
Paths: "hub" (the kernels' Pallas paths), "jax_default" (the same step on their XLA paths: lax.ragged_dot, XLA
attention over the gathered pages, XLA RMSNorm), "default_compiled" (decode_step.transformers_kernels), "vllm_tpu"
(modeled only: the hub step with its experts sorted through two ragged dots, the glue vLLM's gmm needs, compiled for
those XLA ops, and vLLM TPU's attention and gmm swapped in for ours, decode_vllm.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from kernel_hub.tpu.chips import chip
from kernel_hub.tpu.worker_common import first_meaningful_line, load_package, refuse

from . import decode_models as dm
from .decode_step import (
    AXIS,
    Kernels,
    abstract_inputs,
    decode_step,
    hub_kernels,
    routes_in_experts,
    transformers_kernels,
)
from .hlo_program import HloParseError, parse_module
from .ici import collective_seconds, interconnect
from .mesh_worker import slice_target
from .rates import rates
from .schedule import ScheduleCost, kernel_cost
from .workload import topk_routing
from .xla_compiled import CompiledCost, NotReadable, charge_module, compile_with_text

if TYPE_CHECKING:
    from types import ModuleType

    from kernel_hub.json_types import JsonDict
    from kernel_hub.tpu.worker_common import Emit

PATHS = ("hub", "jax_default", "default_compiled", "vllm_tpu")
#: How the step's layers reach their weights and caches, recorded in every row: "stacked" (the experts' weights and
#: the caches passed whole to the kernels with the layer as an index, nothing sliced per layer); rows recorded before
#: it have no such field (each layer's experts and caches sliced out of the scan's stacks).
STEP = "stacked"


def path_kernels(path: str, rms: ModuleType, fa: ModuleType, rd: ModuleType) -> Kernels:
    if path == "hub":
        return hub_kernels(rms, fa, rd, "pallas", False)
    if path == "vllm_tpu":  # the hub step with its experts sorted through ragged dots, kernels swapped when modeled
        # (vLLM's attention has no output projection: the step keeps it an XLA dot)
        return hub_kernels(rms, fa, rd, "pallas", False, formulation="sorted", out_proj=False)
    if path == "jax_default":
        return hub_kernels(rms, fa, rd, "xla")
    if path == "default_compiled":
        return transformers_kernels(rd)
    raise ValueError(f"unknown path {path!r}; known: {', '.join(PATHS)}")


def metadata(batch: int, cache: int) -> tuple[np.ndarray, np.ndarray]:
    """(kv_lens [B], page_indices [B, pages per sequence]): every sequence at `cache` positions, pages in order."""
    pps = -(-cache // dm.PAGE)
    return np.full((batch,), cache, np.int32), np.arange(batch * pps, dtype=np.int32).reshape(batch, pps)


def compile_step(m: dm.DecodeModel, kern: Kernels, batch: int, cache: int, devices: list) -> JsonDict:
    """The whole step compiled for the slice: per-device memory from the compiler, or its refusal.

    The caches' layout is the compiler's to choose, in and out (Layout.AUTO): it picks the layout the attention
    kernel reads, so the stacks in the scan's carry are never relaid out (with the default layout libtpu copies
    every stack into the kernel's layout before the scan and back after it). A server allocates its caches once
    in the compiled step's input format (`compiled.input_formats`) and donates them step after step."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.layout import Format, Layout
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(devices), (AXIS,))
    params, caches, tokens = abstract_inputs(m, len(devices), batch, cache, jnp.bfloat16, mesh)
    rep = NamedSharding(mesh, P())
    kv = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=rep)
    pages = jax.ShapeDtypeStruct(metadata(batch, cache)[1].shape, jnp.int32, sharding=rep)
    fn = lambda p, c, t, k, pg: decode_step(p, c, t, k, pg, model=m, kernels=kern, mesh=mesh)
    formats = jax.tree.map(lambda a: Format(Layout.AUTO, a.sharding), caches)
    weights = jax.tree.map(lambda a: Format(Layout.AUTO, a.sharding), params)
    ins = (weights, formats, tokens.sharding, rep, rep)
    start = time.perf_counter()
    try:
        jitted = jax.jit(fn, donate_argnums=(1,), in_shardings=ins, out_shardings=(rep, formats))
        compiled, text = compile_with_text(jitted.lower(params, caches, tokens, kv, pages))
    except Exception as exc:  # the compiler's refusal is the result
        return {"compiled": False, "error": first_meaningful_line(str(exc) or type(exc).__name__),
                "compile_seconds": time.perf_counter() - start}
    mem = compiled.memory_analysis()
    out = {"compiled": True, "error": None, "compile_seconds": time.perf_counter() - start,
           "cache_layout": "compiler's (AUTO)", "_program": program_cost(text)}
    if mem is not None:
        arg, tmp, outb = (int(mem.argument_size_in_bytes), int(mem.temp_size_in_bytes),
                          int(mem.output_size_in_bytes))
        alias = int(getattr(mem, "alias_size_in_bytes", 0))
        out |= {"argument_bytes": arg, "temp_bytes": tmp, "output_bytes": outb, "alias_bytes": alias,
                "hbm_per_chip_bytes": arg + tmp + outb - alias}
    return out


def program_cost(text: str) -> CompiledCost | str:
    """The compiled step's ops outside the kernels, charged as libtpu compiled them, or why they cannot be."""
    try:
        return charge_module(parse_module(text))
    except (NotReadable, HloParseError) as exc:
        return str(exc)


def walk(m: dm.DecodeModel, kern: Kernels, batch: int, cache: int, devices: list, generation: str
         ) -> tuple[ScheduleCost, ScheduleCost]:
    """(one layer group with the embedding and LM head, the embedding and LM head alone): their costs on device 0,
    a uniform routing given concretely. A group alone is the difference."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh

    mesh = Mesh(np.array(devices), (AXIS,))
    one = dm.DecodeModel(**{**m.__dict__, "layers": len(m.pattern)})
    params, caches, _ = abstract_inputs(one, len(devices), batch, cache, jnp.bfloat16)
    kv, pages = metadata(batch, cache)
    tokens = np.arange(batch, dtype=np.int32) * 97 % m.vocab
    routing = [(topk_routing(batch, m.experts, m.top_k, seed=p),
                np.full((batch, m.top_k), 1.0 / m.top_k, np.float32)) for p in range(len(m.pattern))]
    leaves, tree = jax.tree.flatten((params, caches))

    def cost(layers: bool) -> ScheduleCost:
        def fn(*flat):
            p, c = jax.tree.unflatten(tree, flat[:len(leaves)])
            t, k, pg = flat[len(leaves):len(leaves) + 3]
            r = [(flat[len(leaves) + 3 + 2 * i], flat[len(leaves) + 4 + 2 * i]) for i in range(len(routing))]
            return decode_step(p, c, t, k, pg, model=one, kernels=kern, mesh=mesh, routing=r, layers=layers)

        n_params = len(jax.tree.leaves(params))  # the caches are donated, as the compiled step donates them
        donated = tuple(range(n_params, len(leaves)))
        given = [a for pair in routing for a in pair]
        return kernel_cost(jax.jit(fn, donate_argnums=donated), *leaves, tokens, kv, pages, *given,
                           generation=generation)

    return cost(True), cost(False)


def collectives(m: dm.DecodeModel, rd: ModuleType, batch: int, n: int, shared_rides: bool = False
                ) -> tuple[list, list]:
    """(per layer, per step outside the layers): (kind, devices, bytes each device sends) of every collective.
    `shared_rides`: the shared MLP's partial sums ride the experts' all-reduce (decode_step.routes_in_experts)."""
    act = batch * m.hidden * 2
    ring = lambda factor, size: factor * (n - 1) / n * size
    scheme = rd.plan_dispatch(batch, m.hidden, m.top_k, m.experts, expert_devices=n, itemsize=2)[0]
    riding = bool(m.shared_intermediate) and shared_rides
    layer = [("all_reduce", n, ring(2, act))] * (2 if m.shared_intermediate and not riding else 1)
    experts = rd.collectives(scheme, rd.MoeSizes(batch, m.hidden, m.top_k, m.experts, n, 1, 2))
    if riding:  # the experts' all-reduce carries both outputs side by side
        experts = [(kind, group, 2 * sent) if kind == "all_reduce" else (kind, group, sent)
                   for kind, group, sent in experts]
    layer += experts
    ends = [("all_reduce", n, ring(2, act)), ("all_gather", n, ring(1, 8 * batch * n))]
    return layer, ends


def collective_s(items: list, generation: str, end: str | None = None) -> float:
    return sum(sum(collective_seconds(kind, group, sent, generation, end)) for kind, group, sent in items)


def step_collectives(m: dm.DecodeModel, rd: ModuleType, batch: int, n: int, generation: str,
                     shared_rides: bool = False) -> dict:
    """A decode step's collectives in seconds at the point (None) and at the band's "fast" and "slow" ends."""
    layer, ends = collectives(m, rd, batch, n, shared_rides)
    return {end: m.groups * len(m.pattern) * collective_s(layer, generation, end) + collective_s(ends, generation, end)
            for end in (None, "fast", "slow")}


def modeled(m: dm.DecodeModel, kern: Kernels, rd: ModuleType, batch: int, cache: int, devices: list,
            generation: str, vllm: bool = False, program: CompiledCost | str | None = None) -> JsonDict:
    """The step's modeled seconds on `generation`, its band, and the split into kernels, XLA ops and collectives:
    step = ends + groups x (one group with the ends - the ends), plus the collectives. The XLA ops outside the
    kernels: as the compiled step keeps them (`program`, its kernels matched to the walk's by count) where given,
    else by the jaxpr rule; both are in the row (xla_s and xla_jaxpr_s, xla_rule says which one counts)."""
    first, ends = walk(m, kern, batch, cache, devices, generation)
    first.ici_bytes = ends.ici_bytes = 0  # the collectives are charged below, latency included
    c = chip(generation)
    g = m.groups
    from jax.sharding import Mesh

    rides = bool(m.shared_intermediate) and routes_in_experts(m, kern, batch, Mesh(np.array(devices), (AXIS,)))
    coll_at = step_collectives(m, rd, batch, len(devices), generation, rides)
    coll = coll_at[None]
    scaled = lambda f: f(ends) + g * (f(first) - f(ends))
    bands = [first.band(c), ends.band(c)]
    lo_hi = [bands[1][i] + g * (bands[0][i] - bands[1][i]) + coll_at[end] for i, end in ((0, "fast"), (1, "slow"))]
    if vllm:  # vLLM's attention and gmm in place of ours, per group
        from .decode_vllm import ours_in, peer_group_costs, peers_seconds

        peers = peer_group_costs(m, batch, cache, len(devices), generation)
        swap = lambda level: g * (peers_seconds(peers, c, level) - ours_in(first, c, level)
                                  + ours_in(ends, c, level))
        lo_hi = [lo_hi[0] + swap("fast"), lo_hi[1] + swap("slow")]
    delta = swap(None) if vllm else 0.0
    jaxpr_xla = lambda level: scaled(lambda s: sum(o.seconds(c, rates(generation, level) if level else None)
                                                   for o in s.xla))
    out = {"modeled_s": scaled(lambda s: s.seconds(c)) + coll + delta, "band_s": lo_hi,
           "kernels_s": scaled(lambda s: sum(k.seconds(c) for k in s.calls)) + delta,
           "xla_s": jaxpr_xla(None), "collectives_s": coll, "collectives_band_s": [coll_at["fast"], coll_at["slow"]],
           "kernel_calls": scaled(lambda s: len(s.calls)), "xla_ops": scaled(lambda s: len(s.outside_ops)),
           "modeled_hbm_bytes": scaled(lambda s: s.hbm_bytes),
           "kernels_top": kernel_top(first, ends, g, c), "shared_rides_experts_all_reduce": rides}
    out |= {"xla_jaxpr_s": out["xla_s"], "xla_ops_jaxpr": out["xla_ops"], "modeled_jaxpr_s": out["modeled_s"],
            "band_jaxpr_s": list(lo_hi), "xla_rule": "jaxpr (the step was not compiled)"}
    if isinstance(program, str):
        out["xla_rule"] = f"jaxpr (compiled program not readable: {program})"
    elif program is not None and len(program.kernels) != out["kernel_calls"]:
        out["xla_rule"] = (f"jaxpr (the compiled step calls {len(program.kernels)} kernels, the walk "
                           f"{out['kernel_calls']}: they cannot be matched)")
    elif program is not None:
        ops = program.charged
        at = lambda level: sum(o.seconds(c, rates(generation, level) if level else None) for o in ops)
        shift = {level: at(level) - jaxpr_xla(level) for level in (None, "fast", "slow")}
        out |= {"modeled_s": out["modeled_s"] + shift[None], "xla_s": at(None),
                "xla_ops": sum(o.fixed for o in ops), "xla_scalar_ops": sum(not o.fixed for o in ops),
                "band_s": [lo_hi[0] + shift["fast"], lo_hi[1] + shift["slow"]], "xla_rule": "compiled",
                "xla_in_place_ops": sum(" in-place" in o.name for o in ops), "xla_top": top_ops(ops, c),
                "modeled_hbm_bytes": out["modeled_hbm_bytes"] - scaled(lambda s: s.outside_bytes)
                + sum(o.bytes for o in ops)}
    return out


def kernel_top(first: ScheduleCost, ends: ScheduleCost, groups: int, c: object) -> list:
    """The step's kernels by name: [name, calls per step, modeled seconds in all, HBM bytes in all, seconds at
    spec HBM bandwidth for those bytes]: how far each kernel sits from its own read."""
    by: dict[str, list] = {}
    for calls, times in ((first.calls, groups), (ends.calls, 1 - groups)):
        for k in calls:
            e = by.setdefault(k.name, [k.name, 0, 0.0, 0, 0.0])
            e[1] += times
            e[2] += times * k.seconds(c)
            e[3] += times * k.hbm_bytes
            e[4] += times * k.hbm_bytes / c.hbm_bytes_per_s
    return sorted((e for e in by.values() if e[1]), key=lambda e: -e[2])


def top_ops(ops: list, c: object, n: int = 8) -> list:
    """The compiled glue's costliest ops: [name, times it runs, modeled seconds in all, HBM bytes each]."""
    by: dict[str, list] = {}
    for o in ops:
        entry = by.setdefault(o.name, [o.name, 0, 0.0, o.bytes])
        entry[1] += 1
        entry[2] += o.seconds(c)
    return sorted(by.values(), key=lambda e: -e[2])[:n]


def floor(m: dm.DecodeModel, batch: int, cache: int, generation: str, n: int) -> JsonDict:
    c = chip(generation)
    b = dm.floor_bytes_per_device(m, batch, cache, n)
    return {"hbm_floor_bytes": b, "hbm_floor_s": dm.floor_seconds(b, c.hbm_bytes_per_s),
            "weight_bytes_per_chip": dm.weight_bytes_per_device(m, n),
            "kv_cache_bytes_per_chip": dm.kv_cache_bytes_per_device(m, batch, cache, n),
            "hbm_capacity_bytes": interconnect(generation).hbm_bytes // c.devices_per_chip}


def reduced(m: dm.DecodeModel, groups: int | None) -> dm.DecodeModel:
    """The model cut to `groups` layer groups (a compile gate's or a test's short step); None: as it is."""
    return m if groups is None else dm.DecodeModel(**{**m.__dict__, "layers": groups * len(m.pattern)})


def run_decode(request: JsonDict, emit: Emit) -> int:
    """Request: {"mode": "decode", "rms_norm", "flash_attention", "ragged_dot" (VerifiedPackage.request()s),
    "models" [names | "tiny_<name>"], "batches", "caches" [positions], "generations", "paths", "model_only",
    "compile_only", "groups" (null: the whole model), "compile" [[model, batch, cache, generation, path], ...] | null
    (which rows compile; null: all)}."""
    from kernel_hub.errors import KernelHubError

    try:
        rms, fa, rd = (load_package(request[k]) for k in ("rms_norm", "flash_attention", "ragged_dot"))
    except KernelHubError as exc:
        return refuse(exc, emit)
    wanted = request.get("compile")
    wanted = None if wanted is None else {tuple(w) for w in wanted}
    for generation in request["generations"]:
        with slice_target(generation) as devices:
            for name in request["models"]:
                m = reduced(model_named(name), request.get("groups"))
                for batch in request["batches"]:
                    for cache in request["caches"]:
                        for path in request["paths"]:
                            emit({"event": "start", "generation": generation,
                                  "name": f"{m.name}:{batch}:{cache}:{path}"})
                            kern = path_kernels(path, rms, fa, rd)
                            row: JsonDict = {"model": m.name, "batch": batch, "cache": cache, "chip": generation,
                                             "mesh": interconnect(generation).slice8, "devices": len(devices),
                                             "path": path, "layers": m.layers, "step": STEP, "compiled": False,
                                             **floor(m, batch, cache, generation, len(devices))}
                            key = (name, batch, cache, generation, path)
                            if path != "vllm_tpu" and not request.get("model_only") and (
                                    wanted is None or key in wanted):
                                row |= compile_step(m, kern, batch, cache, devices)
                            program = row.pop("_program", None)
                            if path == "vllm_tpu" and not request.get("model_only"):  # the glue of vLLM's kernels
                                program = compile_step(m, kern, batch, cache, devices).get("_program")
                            if not request.get("compile_only"):
                                try:
                                    row |= modeled(m, kern, rd, batch, cache, devices, generation,
                                                   vllm=path == "vllm_tpu", program=program)
                                except Exception as exc:  # the model's refusal (Unmodeled) is the result
                                    row |= {"modeled_s": None, "model_error": first_meaningful_line(str(exc))}
                            emit({"event": "row", **row})
    return 0


def model_named(name: str) -> dm.DecodeModel:
    """A seed model by name, or its tiny form ("tiny_<name>", head dims kept at the kernels' 128 lanes)."""
    if name.startswith("tiny_"):
        return dm.tiny(dm.MODELS[name[5:]], head_dim=128)
    return dm.MODELS[name]


__all__ = ["PATHS", "run_decode"]
