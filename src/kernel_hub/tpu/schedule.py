"""A TPU cost model read from a kernel's own schedule, not from a formula typed beside it.

`kernel_cost(fn, *args)` traces the call to a jaxpr and evaluates it: everything outside the pallas_calls
runs concretely where its inputs are known (so a ragged dot's real group metadata for the given routing is
computed), big operands stay abstract. Each pallas_call's grid is walked in order (last axis fastest, as the
Pallas TPU pipeline runs it) with the real scalar-prefetch values:

  * HBM bytes: an input block is fetched when its block index changes between consecutive steps (and at
    step 0); an output block is written back when its index changes (and after the last step);
  * MXU FLOPs: every dot_general in the kernel body at block shapes (padding included), counted only on the
    steps whose scalar control flow (pl.when / cond on program ids and scalar-prefetch refs) reaches it;
  * grid steps.

Modeled time on a chip = per call max(bytes / HBM bandwidth, FLOPs / peak) + steps x STEP_OVERHEAD_S, plus
the bytes of XLA ops outside the kernels that touch the big operands (pads, copies) at HBM bandwidth.
Needs jax only (not libtpu): runs in the main environment too.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .chips import F32_HIGHEST_PASSES, STEP_OVERHEAD_S, Chip


@dataclass
class CallCost:
    """One pallas_call as scheduled."""

    name: str
    grid: tuple[int, ...]
    steps: int
    read_bytes: int
    write_bytes: int
    flops: int  # MXU FLOPs at block shapes on the steps that reach each dot
    mxu_flops: float  # flops weighted by MXU passes (an f32 dot is F32_HIGHEST_PASSES bf16 passes)
    fetches: dict[str, int] = field(default_factory=dict)  # operand -> block transfers
    notes: list[str] = field(default_factory=list)

    @property
    def hbm_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def seconds(self, chip: Chip) -> float:
        bound = max(self.hbm_bytes / chip.hbm_bytes_per_s, self.mxu_flops / chip.bf16_flops_per_s)
        return bound + self.steps * STEP_OVERHEAD_S


@dataclass
class ScheduleCost:
    calls: list[CallCost] = field(default_factory=list)
    outside_bytes: int = 0  # XLA ops outside the kernels on the big operands (read + written)
    outside_ops: list[str] = field(default_factory=list)

    @property
    def hbm_bytes(self) -> int:
        return sum(c.hbm_bytes for c in self.calls) + self.outside_bytes

    @property
    def flops(self) -> int:
        return sum(c.flops for c in self.calls)

    @property
    def steps(self) -> int:
        return sum(c.steps for c in self.calls)

    def seconds(self, chip: Chip) -> float:
        return sum(c.seconds(chip) for c in self.calls) + self.outside_bytes / chip.hbm_bytes_per_s


class Unknown:
    """A value the model does not compute (a big operand, a vector in VMEM): only its type is known."""

    __slots__ = ("aval",)

    def __init__(self, aval: Any):
        self.aval = aval


def _nbytes(aval: Any) -> int:
    shape = getattr(aval, "shape", ())
    return int(math.prod(shape)) * np.dtype(aval.dtype).itemsize if hasattr(aval, "dtype") else 0


@contextlib.contextmanager
def tpu_dispatch() -> Iterator[None]:
    """Kernels that pick their path from jax.default_backend() pick the TPU one while tracing for a TPU."""
    import jax

    saved = jax.default_backend
    jax.default_backend = lambda: "tpu"
    try:
        yield
    finally:
        jax.default_backend = saved


# ------------------------------------------------------------------------------------ outer evaluation

#: Layout-only ops: no HBM traffic of their own.
_FREE = {"reshape", "squeeze", "expand_dims", "broadcast_in_dim"}
_SUBJAXPR_KEYS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _padded(rows: int, cols: int) -> int:
    return -(-rows // 8) * 8 * (-(-cols // 128) * 128)


def _layout_only(eqn: Any) -> bool:
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


def _sub_jaxpr(eqn: Any) -> tuple[Any, list[Any]] | None:
    for key in _SUBJAXPR_KEYS:
        sub = eqn.params.get(key)
        if sub is None or eqn.primitive.name == "pallas_call":
            continue
        if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
            return sub.jaxpr, list(sub.consts)
        if hasattr(sub, "eqns"):
            return sub, []
    return None


def _read(env: dict[Any, Any], var: Any) -> Any:
    from jax.extend.core import Literal

    return var.val if isinstance(var, Literal) else env[var]


def _eval_outer(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], acc: ScheduleCost) -> list[Any]:
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        invals = [_read(env, v) for v in eqn.invars]
        prim = eqn.primitive
        if prim.name == "pallas_call":
            acc.calls.append(walk_pallas_call(eqn, invals))
            outs = [Unknown(v.aval) for v in eqn.outvars]
        elif not any(isinstance(x, Unknown) for x in invals):
            out = prim.bind(*invals, **prim.get_bind_params(eqn.params))
            outs = list(out) if prim.multiple_results else [out]
        elif (sub := _sub_jaxpr(eqn)) is not None:
            outs = _eval_outer(sub[0], sub[1], invals, acc)
        else:
            if prim.name not in _FREE and not _layout_only(eqn):  # arrays only: scalars live in registers
                moved = sum(_nbytes(v.aval) for v in [*eqn.invars, *eqn.outvars] if getattr(v.aval, "shape", ()))
                acc.outside_bytes += moved
                acc.outside_ops.append(f"{prim.name} {moved / 2**20:.1f} MiB")
            outs = [Unknown(v.aval) for v in eqn.outvars]
        env.update(zip(eqn.outvars, outs, strict=True))
    return [_read(env, v) for v in jaxpr.outvars]


def kernel_cost(fn: Any, *args: Any) -> ScheduleCost:
    """The schedule cost of `fn(*args)`. Concrete arrays (e.g. group sizes) are used as given; arguments
    given as jax.ShapeDtypeStruct stay abstract (the weights and activations never need to exist)."""
    import jax

    abstract = [a if isinstance(a, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype)
                for a in args]
    values = [Unknown(a) if isinstance(a, jax.ShapeDtypeStruct) else np.asarray(a) for a in args]
    with tpu_dispatch():
        closed = jax.make_jaxpr(fn)(*abstract)
    acc = ScheduleCost()
    _eval_outer(closed.jaxpr, closed.consts, values, acc)
    return acc


# ------------------------------------------------------------------------ scalar (per-step) evaluation


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """lax.div on integers rounds toward zero."""
    q = np.abs(a) // np.maximum(np.abs(b), 1)
    return np.where((a < 0) ^ (b < 0), -q, q)


_NUMPY_OPS: dict[str, Any] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "rem": np.fmod,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "and": np.logical_and, "or": np.logical_or, "not": np.logical_not,
    "xor": np.logical_xor,
}


class _Steps:
    """Evaluates a kernel body or an index map over all grid steps at once: scalars are arrays [S]."""

    def __init__(self, ids: np.ndarray, grid: tuple[int, ...], note: list[str]):
        self.ids, self.grid, self.notes = ids, grid, note
        self.flops = np.zeros(ids.shape[1], np.float64)
        self.mxu = np.zeros(ids.shape[1], np.float64)
        self.scale = 1.0  # trip count of the scans around the equations being run

    def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], mask: np.ndarray | None) -> list[Any]:
        env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        for eqn in jaxpr.eqns:
            invals = [_read(env, v) for v in eqn.invars]
            outs = self.eqn(eqn, invals, mask)
            env.update(zip(eqn.outvars, outs, strict=True))
        return [_read(env, v) for v in jaxpr.outvars]

    def eqn(self, eqn: Any, invals: list[Any], mask: np.ndarray | None) -> list[Any]:
        name, params = eqn.primitive.name, eqn.params
        unknown = [Unknown(v.aval) for v in eqn.outvars]
        if name == "program_id":
            return [self.ids[params["axis"]]]
        if name == "num_programs":
            return [np.int32(self.grid[params["axis"]])]
        if name == "get":
            return [self._get(invals, params)]
        if name == "dot_general":
            self._dot(eqn, mask)
            return unknown
        if name == "cond":
            return self._cond(eqn, invals, mask)
        if name == "scan":  # a fori_loop with static bounds (e.g. over a block's heads): its body `length` times
            self.scale *= params["length"]
            try:
                self.run(params["jaxpr"].jaxpr, params["jaxpr"].consts, invals, mask)
            finally:
                self.scale /= params["length"]
            return unknown
        if name == "while":
            self.notes.append("while in the kernel body: its body counted once per step")
        if (sub := _sub_jaxpr(eqn)) is not None:
            return self.run(sub[0], sub[1], invals, mask)
        if any(isinstance(x, Unknown) for x in invals) or any(v.aval.shape for v in eqn.outvars):
            return unknown
        return [self._scalar(name, params, invals)]

    def _scalar(self, name: str, params: dict[str, Any], invals: list[Any]) -> Any:
        vals = [np.asarray(x) for x in invals]
        if name in _NUMPY_OPS:
            return _NUMPY_OPS[name](*vals)
        if name == "div":
            return _int_div(*vals) if np.issubdtype(vals[0].dtype, np.integer) else vals[0] / vals[1]
        if name == "select_n":
            return np.choose(vals[0].astype(np.int64), vals[1:])
        if name == "convert_element_type":
            return vals[0].astype(np.dtype(params["new_dtype"]))
        if name == "clamp":
            return np.clip(vals[1], vals[0], vals[2])
        if name == "integer_pow":
            return vals[0] ** params["y"]
        raise NotImplementedError(f"the TPU cost model cannot evaluate scalar op {name!r}")

    def _get(self, invals: list[Any], params: dict[str, Any]) -> Any:
        from jax import tree_util
        from jax._src.state.indexing import NDIndexer, Slice

        ref, leaves = invals[0], invals[1:]
        if not isinstance(ref, np.ndarray) or any(isinstance(x, Unknown) for x in leaves):
            return Unknown(None)
        value = ref
        for t in tree_util.tree_unflatten(params["tree"], leaves):
            if not isinstance(t, NDIndexer) or any(isinstance(i, Slice) for i in t.indices):
                return Unknown(None)
            value = value[tuple(np.asarray(i, np.int64) for i in t.indices)]
        return value

    def _dot(self, eqn: Any, mask: np.ndarray | None) -> None:
        (contract, _), (batch, _) = eqn.params["dimension_numbers"]
        lhs, rhs = (v.aval for v in eqn.invars)
        k = math.prod(lhs.shape[d] for d in contract)
        b = math.prod(lhs.shape[d] for d in batch)
        m = math.prod(lhs.shape) // max(k * b, 1)
        n = math.prod(rhs.shape) // max(k * b, 1)
        flops = 2.0 * b * m * n * k
        f32 = any(np.dtype(a.dtype) == np.float32 for a in (lhs, rhs))
        where = (np.ones_like(self.flops) if mask is None else mask.astype(np.float64)) * self.scale
        self.flops += flops * where
        self.mxu += flops * (F32_HIGHEST_PASSES if f32 else 1) * where

    def _cond(self, eqn: Any, invals: list[Any], mask: np.ndarray | None) -> list[Any]:
        index, operands = invals[0], invals[1:]
        branches = eqn.params["branches"]
        full = np.ones(self.ids.shape[1], bool) if mask is None else mask
        if isinstance(index, Unknown):
            self.notes.append("cond on vector data: every branch counted")
            for br in branches:
                self.run(br.jaxpr, br.consts, operands, full)
            return [Unknown(v.aval) for v in eqn.outvars]
        index = np.clip(np.asarray(index), 0, len(branches) - 1)
        results = [self.run(br.jaxpr, br.consts, operands, full & (index == b)) for b, br in enumerate(branches)]
        outs = []
        for i, v in enumerate(eqn.outvars):
            picks = [r[i] for r in results]
            known = not v.aval.shape and not any(isinstance(p, Unknown) for p in picks)
            outs.append(np.choose(index, [np.asarray(p) for p in picks]) if known else Unknown(v.aval))
        return outs


# ------------------------------------------------------------------------------------ the grid walk


def _block_sizes(block_shape: Sequence[Any], array_shape: Sequence[int], idx: np.ndarray) -> np.ndarray:
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


def walk_pallas_call(eqn: Any, invals: Sequence[Any]) -> CallCost:
    """Walk one pallas_call's grid with the real scalar-prefetch values (see the module docstring)."""
    from jax._src.pallas import core as pallas_core

    params = eqn.params
    gm = params["grid_mapping"]
    name = str(params.get("name_and_src_info", params.get("name", "pallas_call"))).split(" ")[0]
    notes: list[str] = []
    if gm.num_dynamic_grid_bounds:
        raise NotImplementedError(f"{name}: dynamic grid bounds are not modeled")
    grid = tuple(int(g) for g in gm.grid)
    steps = math.prod(grid)
    n_idx = gm.num_index_operands
    scalars = list(invals[:n_idx])
    if any(isinstance(s, Unknown) for s in scalars):
        raise NotImplementedError(f"{name}: scalar-prefetch operands depend on data the model does not have")
    scalars = [np.asarray(s) for s in scalars]
    ids = np.indices(grid, dtype=np.int64).reshape(len(grid), -1) if grid else np.zeros((0, 1), np.int64)
    walker = _Steps(ids, grid, notes)
    read, write = sum(int(s.nbytes) for s in scalars), 0  # scalar prefetch: once into SMEM
    fetches: dict[str, int] = {}
    n_in = gm.num_inputs
    for i, bm in enumerate(gm.block_mappings):
        space = getattr(bm.transformed_block_aval, "memory_space", None)
        if space is pallas_core.MemorySpace.ANY or str(space) in ("any", "hbm"):
            notes.append(f"{bm.origin}: memory space {space} (manual DMA) not modeled")
            continue
        ij = bm.index_map_jaxpr
        outs = walker.run(ij.jaxpr, ij.consts, [*ids, *scalars], None)
        if any(isinstance(o, Unknown) for o in outs):
            raise NotImplementedError(f"{name}: index map of {bm.origin} could not be evaluated")
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
    refs: list[Any] = [*scalars, *[Unknown(v.aval) for v in body.invars[n_idx:]]]
    walker.run(body, getattr(body, "consts", []) if hasattr(body, "consts") else [], refs, None)
    return CallCost(name, grid, steps, read, write, int(walker.flops.sum()), float(walker.mxu.sum()), fetches, notes)
