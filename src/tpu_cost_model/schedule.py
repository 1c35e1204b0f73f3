"""A TPU cost model read from a kernel's own schedule, not from a formula typed beside it: any Pallas TPU kernel.

`kernel_cost(fn, *args)` traces the call to a jaxpr and evaluates it: everything outside the pallas_calls
runs concretely where its inputs are known (so a ragged dot's real group metadata, or megablox gmm's number of
active tiles, is computed for the given routing), big operands stay abstract. Each pallas_call's grid is walked in
order with the real scalar-prefetch values and concrete grid bounds (schedule_grid.py):

  * HBM bytes: BlockSpec blocks fetched when their index changes, outputs written back likewise; operands left in
    HBM move through the DMAs the body starts itself (make_async_copy / async_copy / emit_pipeline), counted on
    the steps and loop iterations whose control flow reaches them; remote copies also count as ICI bytes;
  * MXU FLOPs: every dot_general in the body at block shapes, on the steps that reach it;
  * grid steps.

Several pallas_calls in one function are summed; a shard_map body is costed for one device (device 0's shard of
every concrete argument), its collectives on big operands counted as ICI bytes. An operand aliased to an output
that is the function's own argument costs XLA's copy of it unless the argument is donated (a jit's donated_invars).
Anything the model cannot read is refused with one line naming the primitive (`Unmodeled`), never counted as zero.

Modeled time on one device (chips.py: a v7x chip is two), calibrated against published TPU measurements
(bench/records/tpu_calibration.json) = per call max(bytes / streamed-copy bandwidth, MXU passes / peak + vector
work + steps x step overhead) plus one step's worth of the shorter side (pipeline prologue/epilogue)
(schedule_grid.CallCost.seconds), plus each XLA op outside the kernels on the big operands by the XLA op rule
(xla_ops.py) after dropping what XLA removes (zero-width pads, transposes the next one undoes, copies of donated
buffers). The constants are per generation with a band (rates.py): `seconds` at the points, `band` at both ends.
`explain` shows the program the model reads and what it charges for each op. Needs jax only (not libtpu).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kernel_hub.tpu.chips import Chip
from kernel_hub.tpu.target import tpu_dispatch

from .rates import Rates, mxu_width, rates
from .schedule_grid import CallCost, walk_pallas_call
from .schedule_steps import Env, Unknown, Unmodeled, Value, read, sub_jaxpr
from .xla_ops import XlaOp, cancels, dot_flops, zero_width_pad

if TYPE_CHECKING:
    import jax
    import numpy.typing as npt
    from jax.core import AbstractValue
    from jax.extend.core import Jaxpr, JaxprEqn

__all__ = ["CallCost", "ScheduleCost", "Unknown", "Unmodeled", "XlaOp", "explain", "kernel_cost", "walk_pallas_call"]


@dataclass
class ScheduleCost:
    calls: list[CallCost] = field(default_factory=list)
    xla: list[XlaOp] = field(default_factory=list)  # ops outside the kernels on big operands, charged or removed
    ici_bytes: int = 0  # collectives outside the kernels (inside a shard_map), bytes one device sends
    notes: list[str] = field(default_factory=list)

    @property
    def outside_bytes(self) -> int:
        """Bytes the charged XLA ops outside the kernels read and write."""
        return sum(op.bytes for op in self.xla if op.free is None)

    @property
    def outside_ops(self) -> list[str]:
        """The charged XLA ops outside the kernels, one line each."""
        return [op.line() for op in self.xla if op.free is None]

    @property
    def removed_ops(self) -> list[str]:
        """The XLA ops the model does not charge because XLA removes them, one line each with the reason."""
        return [op.line() for op in self.xla if op.free is not None]

    @property
    def hbm_bytes(self) -> int:
        return sum(c.hbm_bytes for c in self.calls) + self.outside_bytes

    @property
    def flops(self) -> int:
        return sum(c.flops for c in self.calls)

    @property
    def steps(self) -> int:
        return sum(c.steps for c in self.calls)

    @property
    def bounded(self) -> list[str]:
        """Why a kernel's time is a range beyond its constants' bands: loops whose trip count the walk could not
        compute (each call then timed at both ends of what its data allows)."""
        return list(dict.fromkeys(why for c in self.calls for why in c.bounded))

    def seconds(self, chip: Chip, r: Rates | None = None, low: bool = False) -> float:
        """Modeled device time with the generation's constants `r` (the points of their bands by default); a loop
        whose trip count is not known runs as far as its data allows, or with `low` no further than it must."""
        r = r or rates(chip.generation)
        total = sum(c.seconds(chip, r, low) for c in self.calls) + sum(op.seconds(chip, r) for op in self.xla)
        if self.ici_bytes:
            from .ici import interconnect

            total += self.ici_bytes / interconnect(chip.generation).ring_bytes_per_s
        return total

    def band(self, chip: Chip) -> tuple[float, float]:
        """(fast, slow): the modeled time at both ends of the generation's constant bands (equal where every
        constant the time depends on is measured on that generation), and of the trip counts a loop the walk could
        not compute may take (`bounded` says why)."""
        return (self.seconds(chip, rates(chip.generation, "fast"), low=True),
                self.seconds(chip, rates(chip.generation, "slow")))


def _nbytes(aval: AbstractValue | None) -> int:
    shape = getattr(aval, "shape", ())
    return int(math.prod(shape)) * np.dtype(aval.dtype).itemsize if hasattr(aval, "dtype") else 0


# ------------------------------------------------------------------------------------ outer evaluation

#: Layout-only ops: no HBM traffic of their own (a memory-space constraint only pins where an array lives).
_FREE = {"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "with_memory_space_constraint"}


def _padded(rows: int, cols: int) -> int:
    return -(-rows // 8) * 8 * (-(-cols // 128) * 128)


def _layout_only(eqn: JaxprEqn) -> bool:
    """A transpose of the two minor axes of an array that XLA's TPU layout already stores with those axes swapped
    is a bitcast: XLA picks, per array, the minor-axis order that pads (8, 128) tiles less (a [.., 8192, 64] KV
    cache is kept with its 8192 positions in the lanes). Checked against compiled memory: no copy, no temp."""
    if eqn.primitive.name != "transpose":
        return False
    shape, perm = eqn.invars[0].aval.shape, tuple(eqn.params["permutation"])
    n = len(shape)
    if n < 2 or perm != (*range(n - 2), n - 1, n - 2):
        return False
    rows, cols = shape[-2], shape[-1]
    return _padded(cols, rows) < _padded(rows, cols)


#: Collectives: on big operands their bytes travel the ICI; on values the model computes they are not evaluated
#: (a grid bound or scalar prefetch that needs one is then refused).
_COLLECTIVES = {"psum", "psum2", "all_gather", "all_to_all", "ppermute", "reduce_scatter", "psum_scatter", "pmax",
                "pmin", "pbroadcast", "ragged_all_to_all"}
#: Control flow whose body the outer evaluation would have to run per iteration or branch on unknown data.
_OUTER_CONTROL = {"cond", "while", "scan"}


class Transposed(Unknown):
    """A transpose's result, its charge held until something other than a transpose undoing it reads it."""

    __slots__ = ("op", "perm", "source", "undone")

    def __init__(self, aval: AbstractValue | None, source: Unknown, perm: tuple[int, ...], op: XlaOp):
        super().__init__(aval)
        self.source, self.perm, self.op, self.undone = source, perm, op, False


_PENDING = "pending"
#: The primitives that are one Pallas kernel: a gridded pallas_call, and a kernel over a TensorCore mesh (pl.kernel).
_KERNELS = ("pallas_call", "mpmd_map")


def _settle(value: Value) -> None:
    """Something reads a transposed value as it is: XLA materializes the transpose, so it is charged."""
    if isinstance(value, Transposed) and value.op.free == _PENDING:
        value.op.free = None


def _has_pallas(jaxpr: Jaxpr) -> bool:
    from jax._src import core as jax_core

    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _KERNELS:
            return True
        for sub in jax_core.jaxprs_in_params(eqn.params):
            if _has_pallas(sub):
                return True
    return False


class _Outer:
    """The evaluation outside the kernels: concrete where it can be, abstract for big operands."""

    def __init__(self, acc: ScheduleCost, arguments: Sequence[Value]):
        self.acc = acc
        self.arguments = {id(a) for a in arguments if isinstance(a, Unknown)}  # the function's own (not donated)
        self.per_device = False

    def run(self, jaxpr: Jaxpr, consts: Sequence[Value], args: Sequence[Value]) -> list[Value]:
        env: Env = dict(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        for eqn in jaxpr.eqns:
            outs = self.eqn(eqn, [read(env, v) for v in eqn.invars])
            env.update(zip(eqn.outvars, outs, strict=True))
        return [read(env, v) for v in jaxpr.outvars]

    def eqn(self, eqn: JaxprEqn, invals: list[Value]) -> list[Value]:
        prim = eqn.primitive
        name = prim.name
        unknown = [Unknown(v.aval) for v in eqn.outvars]
        if name == "transpose" and isinstance(invals[0], Unknown):
            return [self.transpose(eqn, invals[0])]
        if any(isinstance(x, Unknown) for x in invals) and (
                sub := sub_jaxpr(eqn) or _call_like(eqn, len(invals))) is not None:
            self.donate(eqn, invals)
            return self.run(sub[0], sub[1], invals)
        for value in invals:
            _settle(value)
        if name in _KERNELS:
            self.pallas_call(eqn, invals)
            return unknown
        if name == "shard_map":
            return self.shard_map(eqn, invals)
        if name == "axis_index" and self.per_device:
            return [np.int32(0)]  # device 0 stands for every device
        if name in _COLLECTIVES:
            if self.per_device:
                moved = sum(_nbytes(v.aval) for v in eqn.invars)
                self.acc.ici_bytes += moved
                self.acc.notes.append(f"{name} {moved / 2**20:.2f} MiB over ICI")
            return unknown
        if name == "with_memory_space_constraint":  # where the value lives, not what it is
            return [invals[0]]
        if not any(isinstance(x, Unknown) for x in invals):
            out = prim.bind(*invals, **prim.get_bind_params(eqn.params))
            return list(out) if prim.multiple_results else [out]
        if any(_has_pallas(j) for j in _inner(eqn)):  # never a kernel's bytes counted as one XLA op's
            why = ("a pallas_call inside outer control flow on unknown data" if name in _OUTER_CONTROL
                   else "a pallas_call inside a primitive whose body the model does not run")
            raise Unmodeled(name, "the function around the kernels", why)
        if name not in _FREE:  # arrays only: scalars live in registers
            moved = sum(_nbytes(v.aval) for v in [*eqn.invars, *eqn.outvars] if getattr(v.aval, "shape", ()))
            dots = dot_flops(eqn) if name == "dot_general" else {}
            self.acc.xla.append(XlaOp(name, moved, dots, zero_width_pad(eqn)))
        return unknown

    def transpose(self, eqn: JaxprEqn, value: Unknown) -> Unknown:
        """A transpose on a big operand: a bitcast where XLA's TPU layout already holds the swapped order; the
        identity when it undoes the transpose that made its operand (both free then, unless something else reads
        the middle value); otherwise charged once something reads its result."""
        perm = tuple(int(p) for p in eqn.params["permutation"])
        moved = 2 * _nbytes(eqn.invars[0].aval)
        if isinstance(value, Transposed) and cancels(value.perm, perm):
            value.undone = True
            self.acc.xla.append(XlaOp("transpose", moved, free="undoes the transpose before it"))
            return value.source
        _settle(value)
        if _layout_only(eqn):
            self.acc.xla.append(XlaOp("transpose", moved, free="a bitcast in XLA's TPU layout"))
            return Unknown(eqn.outvars[0].aval)
        op = XlaOp("transpose", moved, free=_PENDING)
        self.acc.xla.append(op)
        return Transposed(eqn.outvars[0].aval, value, perm, op)

    def donate(self, eqn: JaxprEqn, invals: list[Value]) -> None:
        """A jit's donated arguments: XLA may write an aliased output into them, so no copy is charged."""
        for value, donated in zip(invals, eqn.params.get("donated_invars", ()), strict=False):
            if donated and isinstance(value, Unknown):
                self.arguments.discard(id(value))

    def finish(self, outs: Sequence[Value]) -> None:
        """Transposes still waiting: a function result is materialized (charged); one only a transpose undoing
        it read, or nothing read, XLA removes."""
        for value in outs:
            _settle(value)
        for op in self.acc.xla:
            if op.free == _PENDING:
                op.free = "undone by the transpose after it, or unused"

    def pallas_call(self, eqn: JaxprEqn, invals: list[Value]) -> None:
        cost = walk_pallas_call(eqn, invals)
        if self.per_device:
            cost.notes.append("per device (inside a shard_map)")
        gm = eqn.params.get("grid_mapping")
        n_dyn = gm.num_dynamic_grid_bounds if gm is not None else 0
        for operand, _out in cost.aliases:
            value = invals[n_dyn + operand]
            if isinstance(value, Unknown) and not isinstance(value, Transposed):
                moved = 2 * _nbytes(value.aval)
                kept = id(value) in self.arguments
                self.acc.xla.append(XlaOp("copy of aliased argument", moved,
                                          free=None if kept else "aliased to a donated or temporary buffer"))
        self.acc.calls.append(cost)

    def shard_map(self, eqn: JaxprEqn, invals: list[Value]) -> list[Value]:
        """One device's share: each concrete argument sliced to device 0's block, abstract ones at block shape."""
        inner = eqn.params["jaxpr"]
        inner = getattr(inner, "jaxpr", inner)
        consts = list(getattr(eqn.params["jaxpr"], "consts", []))
        args: list[Value] = []
        for var, value in zip(inner.invars, invals, strict=True):
            shape = tuple(var.aval.shape)
            if isinstance(value, Unknown):
                args.append(Unknown(var.aval))
            else:
                arr = np.asarray(value)
                args.append(arr[tuple(slice(0, d) for d in shape)] if arr.shape != shape else arr)
        saved, self.per_device = self.per_device, True
        try:
            self.run(inner, consts, args)
        finally:
            self.per_device = saved
        if not saved:
            self.acc.notes.append("shard_map: costed for one device")
        return [Unknown(v.aval) for v in eqn.outvars]


def _call_like(eqn: JaxprEqn, n_args: int) -> tuple[Jaxpr, list[Value]] | None:
    """A call-like primitive (custom_vmap_call, ...) that holds one closed jaxpr taking exactly its operands."""
    if eqn.primitive.name in _OUTER_CONTROL or eqn.primitive.name in ("shard_map", *_KERNELS):
        return None
    closed = [v for v in eqn.params.values() if hasattr(v, "jaxpr") and hasattr(v, "consts")]
    if len(closed) == 1 and len(closed[0].jaxpr.invars) == n_args:
        return closed[0].jaxpr, list(closed[0].consts)
    return None


def _inner(eqn: JaxprEqn) -> list[Jaxpr]:
    from jax._src import core as jax_core

    return list(jax_core.jaxprs_in_params(eqn.params))


def kernel_cost(fn: Callable[..., object], *args: jax.ShapeDtypeStruct | npt.ArrayLike,
                generation: str | None = None) -> ScheduleCost:
    """The schedule cost of `fn(*args)`. Concrete arrays (e.g. group sizes) are used as given; arguments
    given as jax.ShapeDtypeStruct stay abstract (the weights and activations never need to exist).
    `generation` ("v6e"): trace as for that chip where a kernel asks Pallas which chip it runs on.
    Raises Unmodeled (a NotImplementedError) naming the primitive the model cannot read."""
    import jax

    abstract = [a if isinstance(a, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype)
                for a in args]
    values = [Unknown(a) if isinstance(a, jax.ShapeDtypeStruct) else np.asarray(a) for a in args]
    with tpu_dispatch(generation):
        closed = jax.make_jaxpr(fn)(*abstract)
    acc = ScheduleCost()
    # concrete values (the routing's metadata) computed on the host; dots charged at the chip's MXU width
    with jax.default_device(jax.devices("cpu")[0]), mxu_width(generation):
        outer = _Outer(acc, values)
        outer.finish(outer.run(closed.jaxpr, closed.consts, values))
    return acc


def explain(fn: Callable[..., object], *args: jax.ShapeDtypeStruct | npt.ArrayLike,
            generation: str | None = None, hlo: bool = False) -> str:
    """The program the model reads (the jaxpr of `fn(*args)`) and what it charges: each kernel's grid, bytes and
    FLOPs, each XLA op outside the kernels charged or removed (with why), the modeled time and its band; with
    `hlo`, also the StableHLO jax lowers the function to for TPU (what XLA compiles; the two transposes the model
    drops are still there: XLA's simplifier folds them after this point).

    Args:
        fn, args: as for kernel_cost.
        generation: the TPU generation to trace and time for ("v6e"); None traces as the host does, times nothing.
        hlo: append the lowered StableHLO text.
    Returns:
        The text, one item a line.
    """
    import jax

    from kernel_hub.tpu.chips import chip

    abstract = [a if isinstance(a, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype)
                for a in args]
    with tpu_dispatch(generation):
        closed = jax.make_jaxpr(fn)(*abstract)
    cost = kernel_cost(fn, *args, generation=generation)
    lines = ["# the program the model reads (jaxpr)", str(closed), "# what the model charges"]
    for c in cost.calls:
        lines.append(f"kernel {c.name} grid={c.grid}: {c.steps} steps, {c.hbm_bytes / 2**20:.2f} MiB, "
                     f"{c.flops:.3g} FLOP, {c.vpu_elems:.3g} vector and {c.eup_elems:.3g} transcendental elements, "
                     f"{c.stages:.0f} inner stages, {c.scalar_ops:.0f} ops of scalar-only loop iterations")
    lines += [f"xla {line}" for line in cost.outside_ops]
    lines += [f"removed {line}" for line in cost.removed_ops]
    if generation is not None:
        c = chip(generation)
        fast, slow = cost.band(c)
        lines.append(f"modeled on {generation}: {cost.seconds(c) * 1e6:.2f} us (band {fast * 1e6:.2f} .. "
                     f"{slow * 1e6:.2f} us)")
    if hlo:
        with tpu_dispatch(generation):  # lowered for TPU whatever the host is (Pallas lowers only there)
            text = jax.jit(fn).trace(*abstract).lower(lowering_platforms=("tpu",)).as_text()
        lines += ["# the lowered StableHLO (for TPU)", text]
    return "\n".join(lines)
