"""The grid walk of one pallas_call: block transfers from its BlockSpecs, the body's dots and DMAs per step.

Grid bounds come from concrete values (a dynamic bound, e.g. megablox gmm's number of active tiles, is the value
the routing gives); scalar-prefetch operands are the real arrays. The grid runs in order, last axis fastest, as the
Pallas TPU pipeline runs it: an input block is fetched when its block index changes between consecutive steps (and
at step 0); an output block is written back when its index changes (and after the last step). Operands left in
HBM (memory space ANY / HBM) move only through the DMAs the body starts (schedule_steps.py).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kernel_hub.tpu.chips import Chip

from .rates import Rates, current_mxu_width, mxu_passes, rates, vector_seconds
from .schedule_steps import Smem, Steps, Unknown, UnknownTrips, Unmodeled, Value, memory_space

if TYPE_CHECKING:
    from jax._src.pallas.core import BlockDim, GridMapping
    from jax.extend.core import Jaxpr, JaxprEqn


@dataclass
class CallCost:
    """One pallas_call as scheduled."""

    name: str
    grid: tuple[int, ...]
    steps: int
    read_bytes: int
    write_bytes: int
    flops: int  # MXU FLOPs at block shapes on the steps that reach each dot
    dots: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (lhs, rhs dtype, precision) -> FLOPs
    fetches: dict[str, int] = field(default_factory=dict)  # operand -> block transfers
    notes: list[str] = field(default_factory=list)
    dma_bytes: int = 0  # of read/write bytes, those moved by DMAs the kernel starts itself
    dmas: int = 0  # DMAs the kernel starts itself
    ici_bytes: int = 0  # sent to other chips by remote copies
    aliases: tuple[tuple[int, int], ...] = ()  # (operand, output) pairs written in place
    vpu_elems: float = 0.0  # vector element operations (element-wise, reductions) on all steps
    eup_elems: float = 0.0  # transcendental element operations (exp, ...) on all steps
    stages: float = 0.0  # pipeline stages inside the steps (emit_pipeline's iterations, a kernel's fetch loops)
    scalar_ops: float = 0.0  # scalar-core ops of loop iterations that do nothing else (a metadata pass), all steps
    # a loop whose trip count the walk could not compute: this cost runs it no further than it must (the lower
    # end); `upper` runs it as far as the data it reads allows, `bounded` says why
    upper: CallCost | None = None
    bounded: list[str] = field(default_factory=list)
    # no grid dimension the compiler may split across a megacore's two TensorCores (none "parallel" with more than
    # one step): on v4 / v5p the call runs on one core, at half the chip's MXU and vector rate
    one_core: bool = False

    @property
    def hbm_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def mxu_flops_on(self, generation: str | None) -> float:
        """The dots' FLOPs in bf16-pass equivalents on a generation (rates.mxu_passes per dtype and precision)."""
        return sum(f * mxu_passes(lhs, rhs, prec, generation)[0] for (lhs, rhs, prec), f in self.dots.items())

    @property
    def mxu_flops(self) -> float:
        """mxu_flops_on with no generation named (int8 and fp8 at one pass)."""
        return self.mxu_flops_on(None)

    def seconds(self, chip: Chip, r: Rates | None = None, low: bool = False) -> float:
        """Calibrated device time (bench/records/tpu_calibration.json) with the generation's constants `r`
        (rates.rates(generation), the band's points, by default). A call with a loop whose trip count the walk
        could not compute is timed as far as the data it reads allows (`upper`), or, with `low`, no further than it
        must. The units of a TensorCore run side by side, each step bounded by the slowest: the DMAs stream at the
        bandwidth a copy reaches; the MXU's passes, the VPU's element ops and the EUP's transcendentals issue in the
        same bundles (rates.vector_seconds), the longest of them after each stage's fixed cost (the scalar core
        issues the stage, then the units run), the stages being the grid steps plus the iterations of the loops
        that pipeline inside a step (emit_pipeline's, a kernel's own fetch loops); one stage's worth of the shorter
        of DMA and compute is exposed as the pipeline's prologue/epilogue (the first fetch before any compute, the
        last write-back after it), the pipeline's depth being its stages plus the DMAs its body starts itself; loop
        iterations that only run scalar-core ops (a kernel filling its own metadata before its pipeline) take
        r.scalar_op_s an op, in series with the rest; the call is one op on the device: its fixed cost
        (r.op_fixed_s) is added once. On a megacore (v4, v5p) a call whose grid has no parallel dimension runs on
        one of the two TensorCores: its MXU and vector work at half the chip's rate (`one_core`)."""
        if self.upper is not None and not low:
            return self.upper.seconds(chip, r)
        r = r or rates(chip.generation)
        if self.steps == 0:
            return 0.0
        dma = self.hbm_bytes / (chip.hbm_bytes_per_s * r.stream_fraction)
        cores = 2 if chip.megacore and self.one_core else 1  # one of a megacore's two TensorCores does the work
        mxu = cores * self.mxu_flops_on(chip.generation) / chip.bf16_flops_per_s
        vec = cores * vector_seconds(self.vpu_elems, self.eup_elems, chip.generation, chip.bf16_flops_per_s, r)
        compute = max(mxu, vec) + (self.steps + self.stages) * r.step_overhead_s
        if self.ici_bytes:
            from .ici import interconnect

            dma = max(dma, self.ici_bytes / interconnect(chip.generation).ring_bytes_per_s)
        depth = max(self.steps + self.dmas, 1)
        return max(dma, compute) + min(dma, compute) / depth + self.scalar_ops * r.scalar_op_s + r.op_fixed_s


def _block_sizes(block_shape: Sequence[BlockDim | int | None], array_shape: Sequence[int], idx: np.ndarray
                 ) -> np.ndarray:
    """Elements moved per step for a block at indices idx [S, ndim] (clipped at the array's edge)."""
    from jax._src.pallas import core as pallas_core

    size = np.ones(idx.shape[0], np.int64)
    for d, (bd, dim) in enumerate(zip(block_shape, array_shape, strict=True)):
        if isinstance(bd, pallas_core.Squeezed) or bd is None:
            continue
        bs = int(getattr(bd, "block_size", bd))
        start = idx[:, d] * bs if isinstance(bd, pallas_core.Blocked) else idx[:, d]
        size *= np.clip(dim - start, 0, bs)
    return size


def _whole(bm: object) -> bool:
    """A block that is the whole array (what every step sees, e.g. an SMEM input of metadata)."""
    from jax._src.pallas import core as pallas_core

    shape = tuple(bm.array_aval.shape)
    sizes = tuple(-1 if b is None else 1 if isinstance(b, pallas_core.Squeezed) else int(getattr(b, "block_size", b))
                  for b in bm.block_shape)  # a squeezed dim is a block of one
    return len(sizes) == len(shape) and all(s in (d, -1) for s, d in zip(sizes, shape, strict=True))


def call_name(params: dict[str, object]) -> str:
    """The kernel's name: the pallas_call's `name`, else its body function's."""
    name = params.get("name_and_src_info") or params.get("name")
    if name is None:
        debug = getattr(params.get("jaxpr"), "debug_info", None)
        name = getattr(debug, "func_name", None) or "pallas_call"
    return str(name).split(" ")[0]


def concrete_grid(gm: GridMapping, bounds: Sequence[Value], name: str) -> tuple[int, ...]:
    """The grid with each dynamic bound replaced by its concrete value; refused when a bound is not known."""
    from jax._src.pallas import core as pallas_core

    values = iter(bounds)
    grid = []
    for g in gm.grid:
        if pallas_core.is_dynamic_dim(g):
            v = next(values)
            if isinstance(v, Unknown):
                raise Unmodeled("pallas_call", name, "a dynamic grid bound depends on data the model does not have")
            grid.append(int(np.asarray(v).reshape(-1)[0]))
        else:
            grid.append(int(g))
    return tuple(grid)


#: Walks already done in this process, by what determines them (walk_key): a walk reads no chip, so the same kernel
#: at the same arguments traced for another generation is not walked again (a long pipeline takes minutes).
_WALKS: dict[tuple, CallCost] = {}


def _consts_key(obj: object, out: list) -> bool:
    """Collects the values of the consts of every closed jaxpr in a pallas_call's params (the printed jaxpr names
    them, not their values); False when one is not a plain array."""
    from jax._src import core as jax_core

    if isinstance(obj, jax_core.ClosedJaxpr):
        for c in obj.consts:
            try:
                arr = np.asarray(c)
            except Exception:
                return False
            if arr.dtype == object:
                return False
            out.append((arr.dtype.str, arr.shape, arr.tobytes()))
        return all(_consts_key(p, out) for e in obj.jaxpr.eqns for p in e.params.values())
    if isinstance(obj, jax_core.Jaxpr):
        return all(_consts_key(p, out) for e in obj.eqns for p in e.params.values())
    if isinstance(obj, (tuple, list)):
        return all(_consts_key(p, out) for p in obj)
    return True


def walk_key(eqn: JaxprEqn, invals: Sequence[Value]) -> tuple | None:
    """What a walk depends on: the printed equation (its body, grid and block specs), the values of the consts
    its jaxprs close over, and each operand's value (concrete) or type (abstract); None when one cannot be keyed."""
    consts: list = []
    if not all(_consts_key(v, consts) for v in eqn.params.values()):
        return None
    args = []
    for v in invals:
        if isinstance(v, Unknown):
            args.append(("?", str(v.aval)))
        else:
            arr = np.asarray(v)
            if arr.dtype == object:
                return None
            args.append((arr.dtype.str, arr.shape, arr.tobytes()))
    return str(eqn), tuple(consts), tuple(args)


def walk_pallas_call(eqn: JaxprEqn, invals: Sequence[Value]) -> CallCost:
    """Walk one pallas_call's grid (see the module docstring), or one kernel over a TensorCore mesh (`pl.kernel`,
    the mpmd_map primitive), or return the copy of the same walk done before (for the same MXU width)."""
    key = walk_key(eqn, invals)
    if key is not None:  # a walk charges its dots at the MXU width of the chip it is for
        key = (key, current_mxu_width())
    if key is not None and key in _WALKS:
        return copy.deepcopy(_WALKS[key])
    cost = _walk_mesh(eqn, invals) if eqn.primitive.name == "mpmd_map" else _walk(eqn, invals)
    if key is not None:
        _WALKS[key] = copy.deepcopy(cost)
    return cost


def _walk(eqn: JaxprEqn, invals: Sequence[Value]) -> CallCost:
    """Walk one pallas_call's grid with the real scalar-prefetch values (see the module docstring)."""
    params = eqn.params
    gm = params["grid_mapping"]
    name = call_name(params)
    notes: list[str] = []
    n_dyn = gm.num_dynamic_grid_bounds
    grid = concrete_grid(gm, invals[:n_dyn], name)
    operands = list(invals[n_dyn:])
    steps = math.prod(grid)
    n_idx = gm.num_index_operands
    scalars = operands[:n_idx]
    if any(isinstance(s, Unknown) for s in scalars):
        raise Unmodeled("pallas_call", name, "scalar-prefetch operands depend on data the model does not have")
    scalars = [np.asarray(s) for s in scalars]
    read, write = sum(int(s.nbytes) for s in scalars), 0  # scalar prefetch: once into SMEM
    if steps == 0:
        notes.append("empty grid: the kernel does not run")
        return CallCost(name, grid, 0, read, 0, 0, {}, {}, notes)
    ids = np.indices(grid, dtype=np.int64).reshape(len(grid), -1) if grid else np.zeros((0, 1), np.int64)
    walker = Steps(ids, grid, notes, where=f"pallas_call {name}")
    fetches: dict[str, int] = {}
    n_in = gm.num_inputs
    for i, bm in enumerate(gm.block_mappings):
        if memory_space(bm.transformed_block_aval) in ("any", "hbm"):
            fetches[str(bm.origin)] = 0  # left in HBM: moved only by the body's own DMAs
            continue
        ij = bm.index_map_jaxpr
        outs = walker.run(ij.jaxpr, ij.consts, [*ids, *scalars], None)
        if any(isinstance(o, Unknown) for o in outs):
            raise Unmodeled("pallas_call", name, f"the index map of {bm.origin} could not be evaluated")
        idx = np.stack([np.broadcast_to(np.asarray(o, np.int64), (steps,)) for o in outs], axis=1)
        moves = np.ones(steps, bool)
        moves[1:] = np.any(idx[1:] != idx[:-1], axis=1)
        itemsize = np.dtype(bm.array_aval.dtype).itemsize
        sizes = _block_sizes(bm.block_shape, bm.array_aval.shape, idx) * itemsize
        moved = int(sizes[moves].sum())
        fetches[str(bm.origin)] = int(moves.sum())
        if i < n_in:
            read += moved
        else:  # written back when the index changes: once per run of equal indices
            write += moved
    body = params["jaxpr"]
    refs: list[Value] = [*scalars, *[Unknown(v.aval) for v in body.invars[n_idx:]]]
    for i, bm in enumerate(gm.block_mappings[:n_in]):
        value = operands[n_idx + i]
        if memory_space(bm.transformed_block_aval) == "smem" and _whole(bm) and not isinstance(value, Unknown):
            refs[n_idx + i] = np.array(value)  # read by the body as the call receives it (a loop bound, metadata)
    aliases = tuple((int(a), int(b)) for a, b in params.get("input_output_aliases", ()))
    consts = getattr(body, "consts", [])

    vmapped = tuple(getattr(gm, "vmapped_dims", ()))  # vmap's grid dimensions, which the body does not see
    cost = _walk_body(name, body, consts, refs, n_idx + len(gm.block_mappings), ids, grid, notes, (read, write),
                      fetches, aliases, vmapped)
    cost.one_core = not splits_across_cores(params.get("compiler_params"), grid, vmapped)
    if cost.upper is not None:
        cost.upper.one_core = cost.one_core
    return cost


def splits_across_cores(compiler_params: object, grid: tuple[int, ...], vmapped: tuple[int, ...] = ()) -> bool:
    """Whether a megacore may run the call's grid on both TensorCores: some dimension marked parallel (or core
    parallel) has more than one step. Unmarked dimensions are arbitrary: they run in order, on one core. The
    semantics name the kernel's own dimensions; vmap's (`vmapped`) are parallel, as Mosaic lowers them."""
    own = iter(getattr(compiler_params, "dimension_semantics", None) or ())
    semantics = ["parallel" if d in vmapped else str(next(own, "arbitrary")) for d in range(len(grid))]
    return any(s.lower().endswith("parallel") and n > 1 for s, n in zip(semantics, grid, strict=True))


def _walk_body(name: str, body: Jaxpr, consts: Sequence[Value], refs: list[Value], n_blocks: int, ids: np.ndarray,
               grid: tuple[int, ...], notes: list[str], moved: tuple[int, int], fetches: dict[str, int],
               aliases: tuple[tuple[int, int], ...], vmapped: tuple[int, ...] = ()) -> CallCost:
    """Run a kernel body over its steps (refs: one per body operand, the scratch after the first n_blocks), its
    block transfers `moved` (read, write) already counted; a loop the data does not bound is walked at both ends."""
    steps = ids.shape[1]

    def cost(trips: str | None) -> CallCost:
        walker = Steps(ids, grid, list(notes), where=f"pallas_call {name}", vmapped=vmapped)
        walker.trips = trips
        # scratch in scalar memory starts unknown on every walk; what the kernel stores there it reads back
        fresh = [Smem(tuple(v.aval.shape), np.dtype(v.aval.dtype), steps)
                 if i >= n_blocks and memory_space(v.aval) == "smem" else r
                 for i, (v, r) in enumerate(zip(body.invars, refs, strict=True))]
        walker.run(body, consts, fresh, None)
        dma_read, dma_write = int(walker.dma_read.sum()), int(walker.dma_write.sum())
        return CallCost(name, grid, steps, moved[0] + dma_read, moved[1] + dma_write, int(walker.flops.sum()),
                        dict(walker.dots), fetches, walker.notes, dma_read + dma_write, int(walker.dmas.sum()),
                        int(walker.ici.sum()), aliases, walker.vpu, walker.eup, float(walker.stages.sum()),
                        float(walker.scalar_ops.sum()), bounded=walker.bounded)

    try:
        return cost(None)
    except UnknownTrips:  # walked at both ends of what the data allows
        low, high = cost("low"), cost("high")
        low.upper = high
        low.bounded = list(dict.fromkeys([*low.bounded, *high.bounded]))
        return low


def _walk_mesh(eqn: JaxprEqn, invals: Sequence[Value]) -> CallCost:
    """A kernel over a mesh of TensorCores (`pl.kernel`): its body runs once per core with every operand where it
    lives (SMEM operands it receives concretely read as values, the rest moved by its own DMAs). Only a mesh of one
    core is walked: how a kernel splits its work across cores is its own code's business, per core."""
    params = eqn.params
    name = call_name(params)
    meshes, bodies = params.get("meshes", ()), params.get("jaxprs", ())
    if len(meshes) != 1 or len(bodies) != 1:
        raise Unmodeled("mpmd_map", name, f"a kernel over {len(meshes)} meshes")
    cores = int(np.size(getattr(meshes[0], "devices", ())))
    if type(meshes[0]).__name__ != "TensorCoreMesh" or cores != 1:
        raise Unmodeled("mpmd_map", name, f"a kernel over {type(meshes[0]).__name__} of {cores} cores (one "
                        "TensorCore is modeled)")
    body = getattr(bodies[0], "jaxpr", bodies[0])
    consts = list(getattr(bodies[0], "consts", []))
    refs: list[Value] = [Unknown(v.aval) for v in body.invars]
    read = 0
    for i, value in enumerate(invals):
        if memory_space(body.invars[i].aval) == "smem" and not isinstance(value, Unknown):
            refs[i] = np.array(value)  # in SMEM as the call receives it: metadata, loop bounds
            read += int(np.asarray(value).nbytes)
    aliases = tuple((int(a), int(b)) for a, b in dict(params.get("input_output_aliases", {})).items())
    n_blocks = len(invals) + len(params["out_avals"])
    return _walk_body(name, body, consts, refs, n_blocks, np.zeros((0, 1), np.int64), (), [], (read, 0), {}, aliases)
