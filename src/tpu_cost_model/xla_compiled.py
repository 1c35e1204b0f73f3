"""XLA's ops as libtpu compiled them: what the chip's program keeps outside the Pallas kernels, charged per op.

The jaxpr walk (schedule.py) sees each traced op on its own; libtpu fuses a scale into a transpose, merges
transposes, folds a select on a constant, turns layout changes into bitcasts and inserts copies of its own. Here
the optimized HLO module (hlo_program.py) is charged instead, instruction by instruction of the entry computation:

  * a fusion, a copy, an unfused dot or elementwise op: one XLA op (xla_ops.XlaOp, the same rule and the same
    fitted constants): its HBM bytes in and out (arrays libtpu placed in VMEM, ``S(1)``, move no HBM bytes) and
    its MXU FLOPs (every dot or convolution in its body), plus the fixed cost per op (not for an op on arrays of
    one (8, 128) tile at most: scalar-size bookkeeping); a fusion that updates one of its operands in place (a
    dynamic-update-slice or scatter root into a buffer libtpu aliases to its output) moves only the update, and an
    operand read only through dynamic slices or gathers (nested fusions included, and the relayouts libtpu nests
    before a slice, which are evaluated only where the slice reads) moves only what they take;
  * a copy into scalar memory, a cross-program prefetch (its DMA runs before the program starts): nothing;
  * an async copy (copy-start), or the ops of an async computation (async-start: e.g. libtpu's sliced prefetch of a
    kernel's operand into VMEM): their HBM bytes, no fixed cost (DMAs the program starts and run beside the work);
  * a static slice: the operand bytes it takes (its output's), not the whole operand;
  * a bitcast, a constant, a parameter, a tuple and the wait of an async op: nothing (shown with why);
  * a Pallas kernel (custom-call ``tpu_custom_call``, or a fusion whose root is one: the kernel with producers of
    its inputs fused in, e.g. a layer sliced out of a stacked weight): not charged here; the jaxpr walk's cost of the
    same kernel stands for it (the kernels are matched by count and order);
  * a collective: its bytes over the ICI.

A while loop is charged its body times its trip count (stated in its backend_config, or read from its bounds: a
counter from a constant, by a constant step, against a constant). Refused, with the reason, where the program's cost
cannot be read from it: a while loop whose trip count is neither, a conditional (which branch runs is data). The
caller then keeps the jaxpr rule and says why.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .hlo_program import NUMPY_NAMES, VMEM, Computation, Instruction, Module, parse_module
from .schedule import ScheduleCost
from .xla_ops import XlaOp

if TYPE_CHECKING:
    from collections.abc import Callable

    from kernel_hub.tpu.chips import Chip

#: Instructions that move no data: their reason, shown where they hold a big array.
_FREE = {"bitcast": "a bitcast: the layout already holds it, no data moves",
         "constant": "a constant folded into the program",
         "copy-done": "the wait of an async copy (its bytes are charged at its start)",
         "parameter": "", "get-tuple-element": "", "tuple": "", "after-all": "", "partition-id": "",
         "replica-id": "", "opt-barrier": "", "async-done": "", "all-reduce-done": "", "all-gather-done": "",
         "collective-permute-done": "", "add-dependency": ""}
_COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "all-reduce-start",
                "all-gather-start", "collective-permute-start", "ragged-all-to-all"}
_NO_OP_TARGETS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "AllocateBuffer",
                  "MoveToHost", "MoveToDevice", "annotate_device_placement",
                  "ConcatBitcast"}  # the pieces of a sliced prefetch, already in place, seen as one array
KERNEL_TARGET = "tpu_custom_call"
#: Memory spaces of scalars and semaphores (not HBM, not VMEM): moving a value there is the scalar unit's work.
_SCALAR_SPACES = {2, 3, 4, 5, 6}
#: One (8, 128) tile of 32-bit words: an op on nothing larger is scalar-size bookkeeping (a broadcast of a constant
#: into a kernel's scalar operands), charged no fixed cost (that is fitted on a full-size op).
_TILE_BYTES = 4096
_PREFETCH = "a cross-program prefetch: its DMA runs before the program, beside the one before it"


class NotReadable(Exception):
    """The compiled program holds something whose cost it does not state (the message says what)."""


@dataclass
class CompiledCost:
    """What the compiled program keeps outside its kernels, and how many kernels it calls."""

    ops: list[XlaOp] = field(default_factory=list)  # charged and free ones (free: the reason)
    kernels: list[str] = field(default_factory=list)  # the tpu_custom_call instructions, in program order
    ici_bytes: int = 0

    @property
    def charged(self) -> list[XlaOp]:
        return [op for op in self.ops if op.free is None]


def _hbm_bytes(inst: Instruction) -> int:
    return sum(a.nbytes for a in inst.arrays if a.memory_space != VMEM)


def _precision(inst: Instruction) -> str:
    raw = inst.attrs.get("operand_precision", "").strip("{}").split(",")
    names = [p.strip().upper() for p in raw if p.strip()]
    for name in ("HIGHEST", "HIGH"):
        if name in names:
            return name
    return "DEFAULT"


def _dot_flops(inst: Instruction, comp_shapes: dict[str, Instruction]) -> tuple[tuple[str, str, str], float] | None:
    """A dot's or a convolution's (operand types, precision) and FLOPs: 2 x output elements x contracted size."""
    lhs, rhs = (comp_shapes.get(o) for o in inst.operands[:2])
    if lhs is None or rhs is None or not inst.arrays:
        return None
    out = math.prod(inst.arrays[0].dims)
    if inst.opcode == "dot":
        dims = [int(d) for d in inst.attrs.get("lhs_contracting_dims", "{}").strip("{}").split(",") if d.strip()]
        k = math.prod(lhs.arrays[0].dims[d] for d in dims)
    else:  # convolution: the kernel's elements per output feature
        labels = inst.attrs.get("dim_labels", "")
        kernel = labels.split("_")[1].split("->")[0] if "_" in labels else ""
        rdims = rhs.arrays[0].dims
        o = kernel.find("o")
        k = math.prod(rdims) // max(rdims[o], 1) if 0 <= o < len(rdims) else 0
    key = (NUMPY_NAMES.get(lhs.arrays[0].dtype, lhs.arrays[0].dtype),
           NUMPY_NAMES.get(rhs.arrays[0].dtype, rhs.arrays[0].dtype), _precision(inst))
    return key, 2.0 * out * k


def _body_dots(module: Module, names: list[str]) -> dict[tuple[str, str, str], float]:
    """Every dot and convolution in the called computations (nested fusions included)."""
    dots: dict[tuple[str, str, str], float] = {}
    for name in names:
        comp = module.computations.get(name)
        if comp is None:
            continue
        shapes = {i.name: i for i in comp.instructions}
        for inst in comp.instructions:
            if inst.opcode in ("dot", "convolution"):
                found = _dot_flops(inst, shapes)
                if found:
                    dots[found[0]] = dots.get(found[0], 0.0) + found[1]
            for key, flops in _body_dots(module, inst.called()).items():
                dots[key] = dots.get(key, 0.0) + flops
    return dots


def _only_bitcasts(module: Module, name: str) -> bool:
    comp = module.computations.get(name)
    return comp is not None and all(i.opcode in ("parameter", "bitcast", "tuple", "get-tuple-element")
                                    for i in comp.instructions)


def _trip_count(module: Module, inst: Instruction, shapes: dict[str, Instruction]) -> int | None:
    """The loop's trip count: stated in its backend_config, or read from its bounds (a counter in the loop's tuple
    that starts at a constant, grows by a constant in the body, and is compared with a constant)."""
    raw = inst.attrs.get("backend_config", "")
    try:
        n = json.loads(raw).get("known_trip_count", {}).get("n") if raw else None
    except (ValueError, AttributeError):
        n = None
    return int(n) if n is not None else _bounded_trip_count(module, inst, shapes)


def _literal(comp_shapes: dict[str, Instruction], name: str) -> int | None:
    """The integer a scalar constant holds, seen through copies and bitcasts; None otherwise."""
    inst = comp_shapes.get(name)
    while inst is not None and inst.opcode in ("copy", "bitcast") and inst.operands:
        inst = comp_shapes.get(inst.operands[0])
    if inst is None or inst.opcode != "constant":
        return None
    try:
        return int(inst.attrs.get("literal", ""))
    except ValueError:
        return None


def _counter(comp_shapes: dict[str, Instruction], name: str) -> int | None:
    """The tuple index of the loop state that `name` reads (a get-tuple-element of the parameter, copied or not)."""
    inst = comp_shapes.get(name)
    while inst is not None and inst.opcode in ("copy", "bitcast") and inst.operands:
        inst = comp_shapes.get(inst.operands[0])
    if inst is None or inst.opcode != "get-tuple-element":
        return None
    src = comp_shapes.get(inst.operands[0]) if inst.operands else None
    if src is None or src.opcode != "parameter":
        return None
    return int(inst.attrs.get("index", "-1"))


def _bounded_trip_count(module: Module, inst: Instruction, shapes: dict[str, Instruction]) -> int | None:
    names = inst.called()
    cond_name, body_name = inst.attrs.get("condition", "").lstrip("%"), inst.attrs.get("body", "").lstrip("%")
    cond, body = module.computations.get(cond_name), module.computations.get(body_name)
    if cond is None or body is None or not names or not inst.operands:
        return None
    cshapes, bshapes = {i.name: i for i in cond.instructions}, {i.name: i for i in body.instructions}
    root, broot = (next((i for i in c.instructions if i.root), None) for c in (cond, body))
    init_tuple = shapes.get(inst.operands[0])
    if init_tuple is None or init_tuple.opcode != "tuple" or broot is None or broot.opcode != "tuple":
        return None

    def value(comp_shapes: dict[str, Instruction], name: str) -> int | None:
        """A constant, or a loop-invariant element of the loop state (the body passes it on) that starts as one."""
        found = _literal(comp_shapes, name)
        j = _counter(comp_shapes, name)
        if found is not None or j is None or j >= len(init_tuple.operands) or j >= len(broot.operands):
            return found
        return _literal(shapes, init_tuple.operands[j]) if _counter(bshapes, broot.operands[j]) == j else None

    if root is None or root.opcode != "compare" or len(root.operands) != 2:
        return None
    direction = root.attrs.get("direction", "")
    a, b = root.operands
    k, limit = _counter(cshapes, a), value(cshapes, b)
    if limit is None:  # the bound first: flip the comparison
        k, limit = _counter(cshapes, b), value(cshapes, a)
        direction = {"GT": "LT", "GE": "LE", "LT": "GT", "LE": "GE"}.get(direction, "")
    if k is None or limit is None or k >= len(init_tuple.operands) or k >= len(broot.operands):
        return None
    start = _literal(shapes, init_tuple.operands[k])
    if start is None:
        return None
    step_inst = bshapes.get(broot.operands[k])
    if step_inst is None or step_inst.opcode != "add" or len(step_inst.operands) != 2:
        return None
    x, y = step_inst.operands
    step = value(bshapes, y) if _counter(bshapes, x) == k else value(bshapes, x) if _counter(
        bshapes, y) == k else None
    if not step or step < 0:
        return None
    if direction == "LT":
        return max(0, -(-(limit - start) // step))
    if direction == "LE":
        return max(0, (limit - start) // step + 1)
    return None


def _through_bitcasts(comp_shapes: dict[str, Instruction], name: str) -> Instruction | None:
    inst = comp_shapes.get(name)
    while inst is not None and inst.opcode == "bitcast" and inst.operands:
        inst = comp_shapes.get(inst.operands[0])
    return inst


def _in_place_update(comp_shapes: dict[str, Instruction], inst: Instruction) -> Instruction | None:
    """The fusion parameter a dynamic-update-slice or scatter writes into, where it is one the fusion's output
    can share (same bytes): XLA updates that buffer in place, moving only the update."""
    if inst.opcode not in ("dynamic-update-slice", "scatter") or not inst.operands:
        return None
    buf = _through_bitcasts(comp_shapes, inst.operands[0])
    if buf is None or buf.opcode != "parameter" or not buf.arrays or not inst.arrays:
        return None
    return buf if buf.arrays[0].nbytes == inst.arrays[0].nbytes else None


def _update_bytes(comp_shapes: dict[str, Instruction], inst: Instruction) -> int:
    """The bytes an in-place dynamic-update-slice (its update) or scatter (its updates) writes."""
    upd = inst.operands[1] if inst.opcode == "dynamic-update-slice" else inst.operands[-1]
    found = comp_shapes.get(upd)
    return sum(a.nbytes for a in found.arrays) if found else 0


def aliased_operands(inst: Instruction) -> set[int] | None:
    """The operands libtpu writes the instruction's output into (its backend_config's aliasing_operands: pairs of
    an operand's number and an output's, numbered after the operands); None where the program does not say."""
    raw = inst.attrs.get("backend_config", "")
    try:
        lists = json.loads(raw).get("aliasing_operands", {}).get("lists") if raw.startswith("{") else None
    except (ValueError, AttributeError):
        return None
    if lists is None:
        return None
    return {int(pair["indices"][0]) for pair in lists if len(pair.get("indices", [])) == 2}


def _users(comp: Computation) -> dict[str, list[tuple[Instruction, int]]]:
    users: dict[str, list[tuple[Instruction, int]]] = {}
    for i in comp.instructions:
        for pos, o in enumerate(i.operands):
            users.setdefault(o, []).append((i, pos))
    return users


def _ends(users: dict[str, list[tuple[Instruction, int]]], name: str) -> list[tuple[Instruction, int]]:
    """Where a value is used, seen through bitcasts: (user, operand position)."""
    out = []
    for u, pos in users.get(name, []):
        out += _ends(users, u.name) if u.opcode == "bitcast" else [(u, pos)]
    return out


#: Opcodes that move a value's elements without computing on them: a fusion of only these is a relayout.
_RELAYOUT = {"parameter", "copy", "bitcast", "transpose", "reshape"}


def _relayout(module: Module, inst: Instruction) -> bool:
    """A fusion that only relays out its one operand (libtpu nests one between a stack in HBM's tiling and a
    dynamic slice that wants another): inside a fusion it is evaluated where its output is used, so what a slice
    of its output takes is what it reads."""
    body = module.computations.get(inst.called()[0]) if inst.opcode == "fusion" and inst.called() else None
    if body is None or len(inst.operands) != 1 or not inst.arrays:
        return False
    params = [i for i in body.instructions if i.opcode == "parameter"]
    return (len(params) == 1 and all(i.opcode in _RELAYOUT for i in body.instructions)
            and math.prod(params[0].arrays[0].dims) == math.prod(inst.arrays[0].dims)
            and params[0].arrays[0].dtype == inst.arrays[0].dtype)


def _fused_kernel(module: Module, inst: Instruction) -> bool:
    """A fusion whose root is a Pallas kernel: the kernel with the producers of inputs it lets XLA fuse
    (allow_input_fusion, e.g. a layer's slice of a stacked weight), evaluated as the kernel reads them."""
    body = module.computations.get(inst.called()[0]) if inst.called() else None
    root = next((i for i in body.instructions if i.root), None) if body is not None else None
    return (root is not None and root.opcode == "custom-call"
            and root.attrs.get("custom_call_target", "").strip('"') == KERNEL_TARGET)


def _value_read(module: Module, comp: Computation, name: str, whole: int, in_place: dict[str, str] | None,
                depth: int) -> int:
    """The bytes of value `name` (of `whole` bytes) that `comp` reads: what the dynamic slices and gathers it feeds
    take (through nested fusions and relayouts), nothing where it is the buffer updated in place, else the whole."""
    uses = _ends(_users(comp), name)
    if not uses or depth > 8:
        return whole
    total = 0
    for u, pos in uses:
        if pos == 0 and u.opcode in ("dynamic-slice", "gather"):
            total += sum(a.nbytes for a in u.arrays)
        elif pos == 0 and in_place and in_place.get(u.name) == name:
            continue
        elif _relayout(module, u):
            total += _value_read(module, comp, u.name, whole, None, depth + 1)
        elif u.opcode == "fusion" and u.called() and u.called()[0] in module.computations:
            total += _param_read(module, module.computations[u.called()[0]], pos, whole, None, depth + 1)
        else:
            return whole
    return min(total, whole)


def _param_read(module: Module, comp: Computation, n: int, whole: int, in_place: dict[str, str] | None = None,
                depth: int = 0) -> int:
    """The bytes of parameter `n` (of `whole` bytes) that `comp` reads (_value_read of the parameter)."""
    param = next((i for i in comp.instructions if i.opcode == "parameter" and i.attrs.get("literal") == str(n)), None)
    if param is None:
        return whole
    return _value_read(module, comp, param.name, whole, in_place, depth)


def fusion_bytes(module: Module, inst: Instruction, shapes: dict[str, Instruction]) -> tuple[int, bool]:
    """(HBM bytes a fusion moves, whether it updates a buffer in place). A parameter read only through dynamic
    slices or gathers (in the fusion or a fusion nested in it) moves what they take; a buffer the fusion's root
    updates in place (a dynamic-update-slice or scatter into a parameter of the output's size, which libtpu marks
    as aliased to the output where it marks any) is neither read nor rewritten whole, only the update is written.
    Everything else: the operands in and the output out."""
    body = module.computations.get(inst.called()[0]) if inst.called() else None
    whole = sum(_hbm_bytes(shapes[o]) for o in inst.operands if o in shapes) + _hbm_bytes(inst)
    if body is None:
        return whole, False
    bshapes = {i.name: i for i in body.instructions}
    root = next((i for i in body.instructions if i.root), None)
    roots = [_through_bitcasts(bshapes, o) for o in root.operands] if root and root.opcode == "tuple" else [
        _through_bitcasts(bshapes, root.name) if root else None]
    params = {int(i.attrs.get("literal", "-1")): i for i in body.instructions if i.opcode == "parameter"}
    marked = aliased_operands(inst)
    shared = None if marked is None else {params[n].name for n in marked if n in params}
    in_place = {r.name: buf.name for r in roots if r is not None and (buf := _in_place_update(bshapes, r))
                and (shared is None or buf.name in shared)}
    moved = 0
    for n, operand in enumerate(inst.operands):
        outer = _hbm_bytes(shapes[operand]) if operand in shapes else 0
        moved += _param_read(module, body, n, outer, in_place) if outer else 0
    outs = list(inst.arrays)
    for k, r in enumerate(roots):
        if r is not None and r.name in in_place and k < len(outs) and outs[k].memory_space != VMEM:
            moved += _update_bytes(bshapes, r)
            outs[k] = None
    moved += sum(a.nbytes for a in outs if a is not None and a.memory_space != VMEM)
    return moved, bool(in_place)


def charge_module(module: Module) -> CompiledCost:
    """The compiled program's ops outside the kernels, charged by the rules above; raises NotReadable."""
    cost = CompiledCost()
    _charge(module, module.entry.name, 1, cost)
    return cost


def _charge(module: Module, comp_name: str, times: int, cost: CompiledCost) -> None:
    comp = module.computations[comp_name]
    shapes = {i.name: i for i in comp.instructions}
    for inst in comp.instructions:
        op = inst.opcode
        operand_bytes = sum(_hbm_bytes(shapes[o]) for o in inst.operands if o in shapes)
        label = f"{op} {inst.name}"
        if op in _FREE:
            big = sum(a.nbytes for a in inst.arrays)
            if _FREE[op] and big >= 1 << 20:
                cost.ops.append(XlaOp(label, big, free=_FREE[op]))
            continue
        if op == "custom-call":
            target = inst.attrs.get("custom_call_target", "").strip('"')
            if target == KERNEL_TARGET:
                cost.kernels += [inst.name] * times
            elif target not in _NO_OP_TARGETS:
                cost.ops += [XlaOp(f"custom-call {target}", operand_bytes + _hbm_bytes(inst))] * times
            continue
        if op in _COLLECTIVES:
            cost.ici_bytes += operand_bytes * times
            continue
        if op == "call":
            for name in inst.called():
                _charge(module, name, times, cost)
            continue
        if op == "async-start":  # a DMA the program starts and runs beside the work: its bytes, no fixed cost
            inner = CompiledCost()
            for name in inst.called():
                _charge(module, name, times, inner)
            cost.ops += [dataclasses.replace(o, fixed=False) for o in inner.ops]
            cost.kernels += inner.kernels
            cost.ici_bytes += inner.ici_bytes
            continue
        if op == "while":
            n = _trip_count(module, inst, shapes)
            if n is None:
                raise NotReadable(f"while loop {inst.name} without a known trip count")
            for name in inst.called():
                _charge(module, name, times * n, cost)
            continue
        if op == "conditional":
            raise NotReadable(f"conditional {inst.name}: which branch runs is data")
        if op == "copy-start":  # (dest, source, context): the DMA reads its source and writes its destination
            dest = inst.arrays[0]
            moved = operand_bytes + (dest.nbytes if dest.memory_space != VMEM else 0)
            prefetch = "cross_program_prefetch_index" in inst.attrs
            cost.ops += [XlaOp(f"copy-start {inst.name}", moved, fixed=False,
                               free=_PREFETCH if prefetch else None)] * times
            continue
        if op == "copy" and all(a.memory_space in _SCALAR_SPACES for a in inst.arrays):
            cost.ops += [XlaOp(label, sum(a.nbytes for a in inst.arrays), free="a copy into scalar memory")] * times
            continue
        if op == "fusion" and _fused_kernel(module, inst):  # a Pallas kernel with its inputs' producers fused in
            cost.kernels += [inst.name] * times
            continue
        if op == "fusion" and _only_bitcasts(module, inst.called()[0] if inst.called() else ""):
            cost.ops += [XlaOp(label, _hbm_bytes(inst), free="a fusion of bitcasts only")] * times
            continue
        dots = _body_dots(module, inst.called()) if op == "fusion" else {}
        if op in ("dot", "convolution") and (found := _dot_flops(inst, shapes)):
            dots = {found[0]: found[1]}
        kind = inst.attrs.get("kind", "")
        if op == "slice":  # a static slice reads only what it takes: its output's elements
            operand_bytes = min(operand_bytes, sum(a.nbytes for a in inst.arrays)) if operand_bytes else 0
        moved, in_place = fusion_bytes(module, inst, shapes) if op == "fusion" else (
            operand_bytes + _hbm_bytes(inst), False)
        kind += " in-place" if in_place else ""
        tiny = all(a.nbytes <= _TILE_BYTES for a in inst.arrays) and all(
            a.nbytes <= _TILE_BYTES for o in inst.operands if o in shapes for a in shapes[o].arrays)
        cost.ops += [XlaOp(f"{label}{' ' + kind.strip() if kind.strip() else ''}", moved, dots,
                           fixed=not tiny)] * times


def compile_with_text(lowered: Any) -> tuple[Any, str]:
    """(the compiled executable, libtpu's optimized HLO text). The text comes from the compiler's own dump: the
    executable's as_text() reads the module back through jaxlib's HLO proto reader, which refuses some programs
    libtpu writes (an async collective's update with several operands)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="hlo-") as folder:
        compiled = lowered.compile({"xla_dump_to": folder, "xla_dump_hlo_as_text": True})
        found = sorted(Path(folder).glob("*.after_optimizations.txt"))
        if not found:
            return compiled, compiled.as_text()
        return compiled, found[-1].read_text()


def compile_text(fn: Callable[..., Any], args: tuple[Any, ...], generation: str, donate: tuple[int, ...] = ()) -> str:
    """libtpu's optimized HLO of `fn(*args)` for the mock topology of `generation` (concrete arrays given as their
    shapes: the program around the kernels does not depend on their values), the arguments `donate` donated."""
    import jax
    import numpy as np

    from kernel_hub.tpu.target import on_device, tpu_dispatch, tpu_target

    sds = jax.ShapeDtypeStruct
    abstract = tuple(a if isinstance(a, sds) else sds(np.shape(a), np.asarray(a).dtype) for a in args)
    with tpu_target(generation) as device, tpu_dispatch(generation):
        return compile_with_text(jax.jit(fn, donate_argnums=donate).lower(*on_device(abstract, device)))[1]


def compiled_cost(fn: Callable[..., Any], args: tuple[Any, ...], generation: str,
                  donate: tuple[int, ...] = ()) -> CompiledCost:
    """The compiled program of `fn(*args)` on `generation`, charged; raises NotReadable or the compiler's error."""
    return charge_module(parse_module(compile_text(fn, args, generation, donate)))


def with_compiled_xla(cost: ScheduleCost, fn: Callable[..., Any], args: tuple[Any, ...], generation: str,
                      donate: tuple[int, ...] = ()) -> tuple[ScheduleCost, str]:
    """The jaxpr walk's kernels with the XLA ops libtpu's compiled program keeps around them, and which rule
    charged those ops: "compiled", or "jaxpr" with the reason no compiled program could stand for them. `donate`:
    the arguments the caller donates (as the jaxpr walk assumes where a kernel writes into its argument)."""
    from kernel_hub.tpu.worker_common import first_meaningful_line

    try:
        compiled = compiled_cost(fn, args, generation, donate)
    except Exception as exc:  # the compiler's refusal or an unreadable program: its first line is the reason
        return cost, f"jaxpr (no compiled program: {first_meaningful_line(str(exc) or type(exc).__name__)})"
    if len(compiled.kernels) != len(cost.calls):
        return cost, (f"jaxpr (the compiled program calls {len(compiled.kernels)} kernels, the jaxpr walk "
                      f"{len(cost.calls)}: they cannot be matched)")
    return ScheduleCost(calls=cost.calls, xla=compiled.ops, ici_bytes=max(cost.ici_bytes, compiled.ici_bytes),
                        notes=cost.notes), "compiled"


def side_by_side(jaxpr_ops: list[XlaOp], compiled_ops: list[XlaOp] | None, chip: Chip) -> str:
    """The XLA ops outside the kernels as the jaxpr walk charges them and as the compiled program keeps them, one
    pair a line with each op's modeled microseconds, and both totals."""
    left = [(op.line(), op.seconds(chip)) for op in jaxpr_ops]
    right = [(op.line(), op.seconds(chip)) for op in compiled_ops or []]
    width = max([len(t) for t, _ in left] + [28]) + 12
    lines = ["# XLA ops outside the kernels (modeled us): jaxpr walk | compiled program".ljust(width)]
    for i in range(max(len(left), len(right))):
        a = f"{left[i][0]}: {left[i][1] * 1e6:.2f}" if i < len(left) else ""
        b = f"{right[i][0]}: {right[i][1] * 1e6:.2f}" if i < len(right) else ""
        lines.append(f"{a.ljust(width)} | {b}")
    total = f"total {sum(s for _, s in left) * 1e6:.2f} us"
    other = "-" if compiled_ops is None else f"total {sum(s for _, s in right) * 1e6:.2f} us"
    lines.append(f"{total.ljust(width)} | {other}")
    return "\n".join(lines)
