"""The per-step evaluator of the TPU cost model: a Pallas kernel body (or an index map) run over every grid step.

Scalars are numpy arrays [S] (one value per grid step), so `pl.when` / `lax.cond` on program ids and scalar-prefetch
refs select the steps a branch runs on. Loops run with their real carries (a fori_loop's counter, a while loop's
condition per step), so DMAs a kernel issues itself (`pltpu.make_async_copy` / `async_copy`, what
`pltpu.emit_pipeline` expands to) are counted on exactly the steps and iterations that reach them. Vectors in VMEM
stay `Unknown` (only their type is known); their work is counted by kind: each dot's FLOPs under its operand dtypes and
precision (the MXU passes are a per-generation rule, rates.mxu_passes), each element-wise or reducing vector op's
elements (VPU) and each transcendental's (EUP). A primitive whose data movement or compute cannot be read is refused
with one line naming it (`Unmodeled`), never a silent zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from .rates import EUP_PRIMITIVES, VPU_PRIMITIVES, dot_key_flops

if TYPE_CHECKING:
    import jax
    from jax._src.state.types import Transform
    from jax.core import AbstractValue
    from jax.extend.core import Jaxpr, JaxprEqn, Literal, Var

#: What a jaxpr variable holds while the model runs a program: a value it computes (NumPy; one per grid step inside
#: a kernel), a constant, or an Unknown standing for a big operand or a vector in VMEM.
Value: TypeAlias = "np.ndarray | np.generic | jax.Array | int | float | bool | Unknown"
#: What an equation reads: a variable, or a literal carrying its value.
Atom: TypeAlias = "Var | Literal"
#: Where the program's variables stand while it runs.
Env: TypeAlias = "dict[Var, Value]"

#: Loops longer than this run their body once, scaled by the trip count (carries then unknown); a note says so.
ITERATION_LIMIT = 4096
#: A while loop still running after this many iterations is refused.
WHILE_LIMIT = 100_000

#: Primitives that do work the model cannot count: refused by name.
REFUSED = {
    "matmul_push_rhs": "explicit MXU pushes are not modeled",
    "matmul_acc_lhs": "explicit MXU accumulation is not modeled",
    "matmul_pop": "explicit MXU pops are not modeled",
    "emit_pipeline": "the emit_pipeline primitive (jax_use_emit_pipeline_primitive) is not modeled; "
                     "the default emit_pipeline expands to loops and DMAs, which are",
    "pipeline_body": "the emit_pipeline primitive's body is not modeled",
    "gather": "a SparseCore gather is not modeled",
    "scatter": "a SparseCore scatter is not modeled",
    "pure_callback": "a host callback's cost is unknown",
    "io_callback": "a host callback's cost is unknown",
}

_HBM_SPACES = {"any", "hbm"}


class Unmodeled(NotImplementedError):
    """What the cost model cannot read, in one line naming the primitive."""

    def __init__(self, primitive: str, where: str, why: str):
        self.primitive = primitive
        super().__init__(f"the TPU cost model cannot read primitive {primitive!r} in {where}: {why}")


class UnknownTrips(Unmodeled):
    """A loop whose trip count depends on data the walk does not have: the call is walked again at both ends."""

    def __init__(self, where: str, why: str):
        super().__init__("while", where, why)
        self.why = why


class Unknown:
    """A value the model does not compute (a big operand, a vector in VMEM): only its type is known."""

    __slots__ = ("aval",)

    def __init__(self, aval: AbstractValue | None):
        self.aval = aval


class Smem:
    """A scratch ref in scalar memory the kernel fills itself (metadata computed from its scalar-prefetch data),
    one copy per grid step: a store with known index and value is kept, and a load reads it back where every
    element it reads was stored; anything else is unknown."""

    __slots__ = ("data", "known")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, steps: int):
        self.data = np.zeros((steps, *shape), dtype)
        self.known = np.zeros((steps, *shape), bool)

    def _at(self, indices: Sequence[Value]) -> tuple[np.ndarray, ...] | None:
        steps = self.data.shape[0]
        if len(indices) != self.data.ndim - 1 or any(isinstance(i, Unknown) for i in indices):
            return None
        index = [np.broadcast_to(np.asarray(i, np.int64), (steps,)) for i in indices]
        if any(np.any((i < 0) | (i >= n)) for i, n in zip(index, self.data.shape[1:], strict=True)):
            return None
        return (np.arange(steps), *index)

    def load(self, indices: Sequence[Value]) -> Value:
        at = self._at(indices)
        if at is None or not self.known[at].all():
            return Unknown(None)
        return self.data[at]

    def store(self, indices: Sequence[Value], value: Value, mask: np.ndarray | None) -> None:
        """Store on the steps that reach it; an unknown index or value forgets the whole ref on those steps."""
        steps = self.data.shape[0]
        reach = np.ones(steps, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), (steps,))
        at = self._at(indices)
        if at is None or isinstance(value, Unknown):
            self.known[reach] = False
            return
        value = np.broadcast_to(np.asarray(value), (steps,))
        rows = at[0][reach]
        picks = (rows, *(i[reach] for i in at[1:]))
        self.data[picks] = value[reach]
        self.known[picks] = True


def read(env: Env, var: Atom) -> Value:
    return var.val if isinstance(var, _literal_type()) else env[var]


_LITERAL: list[type] = []


def _literal_type() -> type:
    """jax's Literal class, imported once (the walk reads it per operand)."""
    if not _LITERAL:
        from jax.extend.core import Literal

        _LITERAL.append(Literal)
    return _LITERAL[0]


class _EqnFacts:
    """What the walk needs of an equation that does not change between visits: read once per equation."""

    __slots__ = ("name", "shaped_out", "sub", "vector_elems")

    def __init__(self, eqn: JaxprEqn):
        self.name = eqn.primitive.name
        self.shaped_out = any(getattr(v.aval, "shape", ()) for v in eqn.outvars)
        sizes = [math.prod(v.aval.shape) for v in [*eqn.invars, *eqn.outvars]
                 if hasattr(v, "aval") and getattr(v.aval, "shape", ())]
        self.vector_elems = float(max(sizes)) if sizes else 0.0
        self.sub = sub_jaxpr(eqn)


def sub_jaxpr(eqn: JaxprEqn) -> tuple[Jaxpr, list[Value]] | None:
    """The one inner jaxpr of a call-like equation (jit, custom_jvp/vjp, remat), with its consts."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(key)
        if sub is None or eqn.primitive.name in ("pallas_call", "scan", "while", "run_scoped", "shard_map"):
            continue
        if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
            return sub.jaxpr, list(sub.consts)
        if hasattr(sub, "eqns"):
            return sub, []
    return None


def memory_space(aval: AbstractValue) -> str:
    space = getattr(aval, "memory_space", None)
    return str(getattr(space, "value", space)).lower()


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """lax.div on integers rounds toward zero."""
    q = np.abs(a) // np.maximum(np.abs(b), 1)
    return np.where((a < 0) ^ (b < 0), -q, q)


_NUMPY_OPS: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "rem": np.fmod,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    # lax's and/or/xor/not are bitwise on integers and logical on bools, as NumPy's bitwise ufuncs are
    "ge": np.greater_equal, "and": np.bitwise_and, "or": np.bitwise_or, "not": np.invert,
    "xor": np.bitwise_xor, "shift_left": np.left_shift, "shift_right_arithmetic": np.right_shift,
    "shift_right_logical": lambda a, b: _shift_right_logical(a, b),
}


def _shift_right_logical(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """lax.shift_right_logical: shift the unsigned bits of a signed integer."""
    a = np.asarray(a)
    unsigned = np.dtype(f"uint{a.dtype.itemsize * 8}")
    return np.right_shift(a.astype(unsigned), np.asarray(b).astype(unsigned)).astype(a.dtype)


def _ref_bytes(var: Var, transforms: Sequence[Transform], where: str) -> tuple[int, str]:
    """Bytes a DMA endpoint covers (the ref after its slices) and the ref's memory space."""
    aval = var.aval
    space = memory_space(aval)
    for t in transforms:
        try:
            aval = t.transform_type(aval)
        except Exception as exc:  # a dynamically sized slice: the DMA's size is not static
            raise Unmodeled("dma_start", where, f"a DMA through {type(t).__name__} of unknown size ({exc})") from exc
    shape = getattr(aval, "shape", ())
    if any(not isinstance(d, (int, np.integer)) for d in shape):
        raise Unmodeled("dma_start", where, "a DMA of dynamic size")
    return int(math.prod(shape)) * np.dtype(aval.dtype).itemsize, space


def _dynamic_ref_bytes(var: Var, transforms: Sequence[Transform], where: str) -> tuple[np.ndarray, str]:
    """Bytes a DMA endpoint covers when a slice's size is a computed scalar (one value per grid step): only plain
    indexers (integer indices and slices) are followed; anything else, or a size the walk does not know, refuses."""
    from jax._src.state.indexing import NDIndexer, Slice

    aval = var.aval
    dims: list[int | np.ndarray] = list(aval.shape)
    for t in transforms:
        if not isinstance(t, NDIndexer):
            if any(np.ndim(d) for d in dims):  # a reshape or bitcast of a ref still at its static shape only
                raise Unmodeled("dma_start", where, f"a DMA of dynamic size through {type(t).__name__}")
            from jax._src import core as jax_core

            dims = list(t.transform_type(jax_core.ShapedArray(tuple(int(d) for d in dims), aval.dtype)).shape)
            continue
        if len(t.indices) > len(dims):
            raise Unmodeled("dma_start", where, "a DMA through an indexer of more dimensions than its ref")
        out: list[int | np.ndarray] = []
        for idx in t.indices:
            if isinstance(idx, Slice):
                if isinstance(idx.size, Unknown):
                    raise Unmodeled("dma_start", where, "a DMA whose size depends on data the model does not have")
                out.append(np.asarray(idx.size, np.int64))
            elif isinstance(idx, Unknown) or np.ndim(idx) <= 1:
                continue  # an integer index (a scalar, or one per step) drops the dimension
            else:
                raise Unmodeled("dma_start", where, "a DMA with a gathered (array) index")
        dims = out + dims[len(t.indices):]
    size = np.ones((), np.int64)
    for d in dims:
        size = size * np.asarray(d, np.int64)
    return size * np.dtype(aval.dtype).itemsize, memory_space(aval)


def _past_end(aval: AbstractValue, transforms: Sequence[Transform]) -> bool:
    """Whether a ref's first indexer, with its computed starts, addresses past the ref's end on some step (a slice's
    end, an index): what bounds a loop whose condition the walk cannot compute."""
    from jax._src.state.indexing import NDIndexer, Slice

    if not transforms or not isinstance(transforms[0], NDIndexer):
        return False
    for idx, dim in zip(transforms[0].indices, getattr(aval, "shape", ()), strict=False):
        if isinstance(idx, Slice):
            if isinstance(idx.start, Unknown) or isinstance(idx.size, Unknown):
                continue
            if np.any(np.asarray(idx.start, np.int64) + np.asarray(idx.size, np.int64) > dim):
                return True
        elif not isinstance(idx, Unknown) and np.ndim(idx) <= 1 and np.any(np.asarray(idx, np.int64) >= dim):
            return True
    return False


class Steps:
    """Evaluates a kernel body or an index map over all grid steps at once: scalars are arrays [S]."""

    def __init__(self, ids: np.ndarray, grid: tuple[int, ...], notes: list[str], where: str = "a Pallas kernel",
                 vmapped: tuple[int, ...] = ()):
        self.ids, self.grid, self.notes, self.where = ids, grid, notes, where
        # the grid dimensions a kernel body's program_id / num_programs name: vmap prepends its own, which the body
        # does not see (its axis 0 stays the unbatched grid's first), as Mosaic lowers them
        self.body_axes = tuple(d for d in range(len(grid)) if d not in vmapped)
        n = ids.shape[1]
        self.flops = np.zeros(n, np.float64)
        self.dots: dict[tuple[str, str, str], float] = {}  # (lhs dtype, rhs dtype, precision) -> FLOPs on all steps
        self.vpu = 0.0  # vector element operations on all steps
        self.eup = 0.0  # transcendental element operations on all steps
        self.dma_read = np.zeros(n, np.float64)  # HBM bytes read by DMAs the kernel issues
        self.dma_write = np.zeros(n, np.float64)
        self.ici = np.zeros(n, np.float64)  # bytes sent to other chips (remote copies)
        self.dmas = np.zeros(n, np.float64)
        self.unevaluated: set[str] = set()  # scalar ops left unknown (named when something needs them)
        self.scale = 1.0  # trip count of the scans around the equations being run (when not iterated)
        # pipeline stages inside a step: iterations of the innermost loops that start DMAs (emit_pipeline's loop,
        # a kernel's own fetch loop), each with a grid step's fixed cost
        self.stages = np.zeros(n, np.float64)
        # scalar-core ops (index arithmetic, SMEM loads and stores) run by loop iterations that start no DMA and do no
        # vector or MXU work: the scalar core runs them alone (a kernel filling its own metadata); `_issued` counts
        # every scalar op the walk runs, so an iteration's own share is its difference
        self.scalar_ops = np.zeros(n, np.float64)
        self._issued = np.zeros(n, np.float64)
        self._waits = np.zeros(n, np.float64)  # DMA waits run: a loop of waits idles under the DMAs it waits for
        # a loop whose condition the walk cannot compute: None refuses it (UnknownTrips), "low" runs no more of it,
        # "high" runs it until its body reads or copies past the end of an array (bounds and their reasons)
        self.trips: str | None = None
        self.bounded: list[str] = []
        self._overran = False  # set when a read or DMA of the current iteration addresses past an array's end
        self._written: set[int] = set()  # concrete (SMEM) refs the body writes: their values are then unknown
        self._static_dma: dict[tuple[int, int], tuple[int, str] | None] = {}  # (equation, endpoint) -> bytes, space
        self._facts: dict[int, tuple[JaxprEqn, _EqnFacts]] = {}  # id(equation) -> it, its static facts
        self._index_counts: dict[int, tuple[object, tuple[int, ...] | None]] = {}  # id(tree) -> it, indices each

    def _facts_of(self, eqn: JaxprEqn) -> _EqnFacts:
        got = self._facts.get(id(eqn))
        if got is None or got[0] is not eqn:
            got = self._facts[id(eqn)] = (eqn, _EqnFacts(eqn))
        return got[1]

    def _where(self, mask: np.ndarray | None) -> np.ndarray:
        return (np.ones(self.ids.shape[1]) if mask is None else mask.astype(np.float64)) * self.scale

    def run(self, jaxpr: Jaxpr, consts: Sequence[Value], args: Sequence[Value], mask: np.ndarray | None
            ) -> list[Value]:
        env: Env = dict(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        literal = _literal_type()
        for eqn in jaxpr.eqns:
            invals = [v.val if isinstance(v, literal) else env[v] for v in eqn.invars]
            outs = self.eqn(eqn, invals, mask)
            env.update(zip(eqn.outvars, outs, strict=True))
        return [read(env, v) for v in jaxpr.outvars]

    def eqn(self, eqn: JaxprEqn, invals: list[Value], mask: np.ndarray | None) -> list[Value]:
        facts = self._facts_of(eqn)
        name, params = facts.name, eqn.params
        if name in REFUSED:
            raise Unmodeled(name, self.where, REFUSED[name])
        if name == "program_id":
            return [self.ids[self.body_axes[params["axis"]]]]
        if name == "num_programs":
            return [np.int32(self.grid[self.body_axes[params["axis"]]])]
        if name == "get":
            if not facts.shaped_out:
                self._issued += self._where(mask)
            return [self._get(invals, params)]
        if name == "swap" and isinstance(invals[0], Smem):
            self._issued += self._where(mask)
            return [self._smem_swap(invals, params, mask)]
        if name == "addupdate" and isinstance(invals[0], Smem):
            self._smem_forget(invals[0], mask)
            return []
        if name in ("swap", "addupdate") and isinstance(invals[0], np.ndarray):
            self._written.add(id(invals[0]))
            return [Unknown(v.aval) for v in eqn.outvars]
        if name == "dot_general":
            self._dot(eqn, mask)
            return [Unknown(v.aval) for v in eqn.outvars]
        if name == "dma_start":
            self._dma(eqn, invals, mask)
            return [Unknown(v.aval) for v in eqn.outvars]
        if name == "dma_wait":
            self._waits += self._where(mask)
            return [Unknown(v.aval) for v in eqn.outvars]
        if name == "cond":
            return self._cond(eqn, invals, mask)
        if name == "scan":
            return self._scan(eqn, invals, mask)
        if name == "while":
            return self._while(eqn, invals, mask)
        if name == "run_scoped":
            inner = params["jaxpr"]
            self.run(inner, invals, [Unknown(v.aval) for v in inner.invars], mask)
            return [Unknown(v.aval) for v in eqn.outvars]
        if (sub := facts.sub) is not None:
            return self.run(sub[0], sub[1], invals, mask)
        if name in VPU_PRIMITIVES or name in EUP_PRIMITIVES:
            self._vector(facts, mask)
        if not facts.shaped_out and eqn.outvars:
            self._issued += self._where(mask)
        if facts.shaped_out or any(isinstance(x, Unknown) for x in invals):
            return [Unknown(v.aval) for v in eqn.outvars]
        if not eqn.outvars:
            return []
        try:
            return [self._scalar(name, params, invals)]
        except Unmodeled:  # a scalar the model cannot compute: any loop bound or DMA that needs it refuses then
            self.unevaluated.add(name)
            return [Unknown(v.aval) for v in eqn.outvars]

    def _scalar(self, name: str, params: dict[str, object], invals: list[Value]) -> np.ndarray:
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
        if name in ("multiple_of", "pjit", "optimization_barrier", "copy", "copy_p"):
            return vals[0]
        raise Unmodeled(name, self.where, "a scalar op the model does not evaluate")

    def _smem_swap(self, invals: list[Value], params: dict[str, object], mask: np.ndarray | None) -> Value:
        """A scalar store into an SMEM scratch ref; returns the value it replaces."""
        ref, value, leaves = invals[0], invals[1], invals[2:]
        indexers = self._indexers(params["tree"], leaves)
        if len(indexers) != 1 or indexers[0] is None:
            self._smem_forget(ref, mask)
            return Unknown(None)
        old = ref.load(indexers[0])
        ref.store(indexers[0], value, mask)
        return old

    def _smem_forget(self, ref: Smem, mask: np.ndarray | None) -> None:
        reach = np.ones(ref.data.shape[0], bool) if mask is None else np.asarray(mask, bool)
        ref.known[np.broadcast_to(reach, (ref.data.shape[0],))] = False

    def _get(self, invals: list[Value], params: dict[str, object]) -> Value:
        ref, leaves = invals[0], invals[1:]
        if isinstance(ref, Smem):
            indexers = self._indexers(params["tree"], leaves)
            return ref.load(indexers[0]) if len(indexers) == 1 and indexers[0] is not None else Unknown(None)
        if not isinstance(ref, np.ndarray) or id(ref) in self._written or any(isinstance(x, Unknown) for x in leaves):
            return Unknown(None)
        value = ref
        for indices in self._indexers(params["tree"], leaves):
            if indices is None:
                return Unknown(None)
            # an index past the end (an index map that overruns on steps whose block is never used) is clamped
            index = [np.asarray(i, np.int64) for i in indices]
            if any(np.any(i >= n) for i, n in zip(index, value.shape, strict=False)):
                self._overran = True
            value = value[tuple(np.clip(i, 0, n - 1) for i, n in zip(index, value.shape, strict=False))]
        return value

    def _indexers(self, tree: object, leaves: list[Value]) -> list[Sequence[Value] | None]:
        """The indices of each indexer a `get` applies (None for one the walk does not follow: a slice, another
        transform). A tree whose indexers are its leaves in order is read once, then split by its counts."""
        counts = self._index_counts.get(id(tree), False)
        if counts is False or counts[0] is not tree:
            from jax import tree_util
            from jax._src.state.indexing import NDIndexer, Slice

            parts = tree_util.tree_unflatten(tree, leaves)
            plain = [isinstance(t, NDIndexer) and not any(isinstance(i, Slice) for i in t.indices) for t in parts]
            flat = [i for t in parts if isinstance(t, NDIndexer) for i in t.indices]
            split = all(plain) and len(flat) == len(leaves) and all(a is b for a, b in zip(flat, leaves, strict=True))
            self._index_counts[id(tree)] = (tree, tuple(len(t.indices) for t in parts) if split else None)
            return [t.indices if ok else None for t, ok in zip(parts, plain, strict=True)]
        if counts[1] is None:
            return self._indexers_slow(tree, leaves)
        out, at = [], 0
        for n in counts[1]:
            out.append(leaves[at:at + n])
            at += n
        return out

    def _indexers_slow(self, tree: object, leaves: list[Value]) -> list[Sequence[Value] | None]:
        from jax import tree_util
        from jax._src.state.indexing import NDIndexer, Slice

        parts = tree_util.tree_unflatten(tree, leaves)
        return [t.indices if isinstance(t, NDIndexer) and not any(isinstance(i, Slice) for i in t.indices) else None
                for t in parts]

    def _dot(self, eqn: JaxprEqn, mask: np.ndarray | None) -> None:
        key, flops = dot_key_flops(eqn)
        where = self._where(mask)
        self.flops += flops * where
        self.dots[key] = self.dots.get(key, 0.0) + flops * float(where.sum())

    def _vector(self, facts: _EqnFacts, mask: np.ndarray | None) -> None:
        """A vector op on VMEM values: its elements (the larger of its operands and results) on the steps that
        reach it; scalar ops (index arithmetic on the scalar core) are not vector work."""
        if not facts.vector_elems:
            return
        elems = facts.vector_elems * float(self._where(mask).sum())
        if facts.name in EUP_PRIMITIVES:
            self.eup += elems
        else:
            self.vpu += elems

    def _dma(self, eqn: JaxprEqn, invals: list[Value], mask: np.ndarray | None) -> None:
        """A DMA the kernel starts: HBM bytes by the endpoints' memory spaces; a remote copy's bytes also on ICI.
        Its wait moves nothing (counted once, at the start). A slice whose size is a scalar the walk computed
        (pl.ds(start, size) with a size read from the scalar-prefetch data) moves that many rows on each step."""
        from jax import tree_util
        from jax._src.state.types import TransformedRef

        tree = eqn.params["tree"]
        src, dst, _dst_sem, _src_sem, device_id = tree_util.tree_unflatten(tree, eqn.invars)

        def endpoint(i: int, ref: Var | TransformedRef) -> tuple[int | np.ndarray, str]:
            if not isinstance(ref, TransformedRef):
                return _ref_bytes(ref, (), self.where)
            key = (id(eqn), i)
            if key not in self._static_dma:  # a static size is the same on every visit: read once per equation
                try:
                    self._static_dma[key] = _ref_bytes(ref.ref, ref.transforms, self.where)
                except Unmodeled:
                    self._static_dma[key] = None
            if self._static_dma[key] is not None:
                return self._static_dma[key]
            value = tree_util.tree_unflatten(tree, invals)[i]
            return _dynamic_ref_bytes(ref.ref, value.transforms, self.where)

        (src_bytes, src_space), (dst_bytes, dst_space) = endpoint(0, src), endpoint(1, dst)
        if self.trips == "high":
            values = tree_util.tree_unflatten(tree, invals)
            for ref, value in ((src, values[0]), (dst, values[1])):
                if isinstance(ref, TransformedRef) and _past_end(ref.ref.aval, value.transforms):
                    self._overran = True
        where = self._where(mask)
        self.dmas += where
        if src_space in _HBM_SPACES:
            self.dma_read += src_bytes * where
        if dst_space in _HBM_SPACES:
            self.dma_write += dst_bytes * where
        if device_id is not None:
            self.ici += dst_bytes * where

    def _cond(self, eqn: JaxprEqn, invals: list[Value], mask: np.ndarray | None) -> list[Value]:
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

    def _scan(self, eqn: JaxprEqn, invals: list[Value], mask: np.ndarray | None) -> list[Value]:
        """A fori_loop / scan: iterated with its real carries (a counter that DMAs or pl.when read), or, past
        ITERATION_LIMIT, its body once scaled by the trip count."""
        p = eqn.params
        length, n_consts, n_carry = int(p["length"]), p["num_consts"], p["num_carry"]
        body = p["jaxpr"]
        consts, carry = invals[:n_consts], list(invals[n_consts:n_consts + n_carry])
        xs_avals = [v.aval for v in body.jaxpr.invars[n_consts + n_carry:]]
        if length > ITERATION_LIMIT:
            self.notes.append(f"a loop of {length} iterations: its body counted once, times {length}")
            self.scale *= length
            try:
                before = self._mark()
                self.run(body.jaxpr, body.consts, [*consts, *carry, *[Unknown(a) for a in xs_avals]], mask)
                self._stage(before, mask)
                self._scalar_iteration(before, mask)
            finally:
                self.scale /= length
            return [Unknown(v.aval) for v in eqn.outvars]
        for _ in range(length):
            before = self._mark()
            outs = self.run(body.jaxpr, body.consts, [*consts, *carry, *[Unknown(a) for a in xs_avals]], mask)
            self._stage(before, mask)
            self._scalar_iteration(before, mask)
            carry = outs[:n_carry]
        return [*carry, *[Unknown(v.aval) for v in eqn.outvars[n_carry:]]]

    def _while(self, eqn: JaxprEqn, invals: list[Value], mask: np.ndarray | None) -> list[Value]:
        """A while loop, run per step until its condition is false on every step that reached it."""
        p = eqn.params
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        cond, body = p["cond_jaxpr"], p["body_jaxpr"]
        cconsts, bconsts, carry = invals[:nc], invals[nc:nc + nb], list(invals[nc + nb:])
        reached = np.ones(self.ids.shape[1], bool) if mask is None else mask
        unknown_from = None  # the iteration from which the condition is not known (run to the data's end)
        for it in range(WHILE_LIMIT):
            (go,) = self.run(cond.jaxpr, cond.consts, [*cconsts, *carry], reached)
            if isinstance(go, Unknown):
                why = "its condition depends on vector data or data the call does not receive concretely"
                if self.unevaluated:
                    why += f" (or on scalar ops not evaluated: {', '.join(sorted(self.unevaluated))})"
                if self.trips is None:
                    raise UnknownTrips(self.where, why)
                if self.trips == "low":
                    self._bound(f"a while loop whose trip count is not known: {why}; at least {it} iteration(s)")
                    return [c if isinstance(c, Unknown) else Unknown(v.aval) if np.ndim(c) else c
                            for c, v in zip(carry, eqn.outvars, strict=True)]
                unknown_from = it if unknown_from is None else unknown_from
                active = reached
            else:
                active = reached & np.broadcast_to(np.asarray(go, bool), reached.shape)
            if not active.any():
                return carry
            before = self._mark()
            self._overran = False
            new = self.run(body.jaxpr, body.consts, [*bconsts, *carry], active)
            if unknown_from is not None and self._overran:  # this iteration would read past the data: the end
                self._restore(before)
                self._bound(f"a while loop whose trip count is not known ({why}): at most {it} iteration(s), "
                            "where its body would next read or copy past the end of an array")
                return [c if isinstance(c, Unknown) else Unknown(v.aval)
                        for c, v in zip(carry, eqn.outvars, strict=True)]
            self._stage(before, active)
            self._scalar_iteration(before, active)
            carry = [o if isinstance(o, Unknown) else c if isinstance(c, Unknown) else np.where(active, o, c)
                     for o, c in zip(new, carry, strict=True)]
        if unknown_from is not None:
            raise Unmodeled("while", self.where, f"{why}, and nothing its body reads bounds it (still running "
                            f"after {WHILE_LIMIT} iterations)")
        raise Unmodeled("while", self.where, f"still running after {WHILE_LIMIT} iterations")

    _COUNTERS = ("flops", "dma_read", "dma_write", "ici", "dmas", "stages", "scalar_ops", "_issued", "_waits")

    def _mark(self) -> tuple:
        """The counters before an iteration (to tell whether it started DMAs, or to undo it)."""
        return (*(getattr(self, c).copy() for c in self._COUNTERS), dict(self.dots), self.vpu, self.eup)

    def _restore(self, mark: tuple) -> None:
        for name, value in zip(self._COUNTERS, mark, strict=False):
            setattr(self, name, value)
        self.dots, self.vpu, self.eup = mark[len(self._COUNTERS):]

    def _stage(self, mark: tuple, mask: np.ndarray | None) -> None:
        """An iteration that started DMAs and holds no inner loop that did is one pipeline stage."""
        started = self.dmas > mark[self._COUNTERS.index("dmas")]
        inner = self.stages > mark[self._COUNTERS.index("stages")]
        self.stages += np.where(started & ~inner, self._where(mask), 0.0)

    def _scalar_iteration(self, mark: tuple, mask: np.ndarray | None) -> None:
        """An iteration that started or waited for no DMA and ran no vector or MXU work: its scalar ops (less those
        of the inner loops already counted) run on the scalar core alone."""
        at = self._COUNTERS.index
        busy = ((self.dmas > mark[at("dmas")]) | (self.flops > mark[at("flops")])
                | (self._waits > mark[at("_waits")]))
        if self.vpu != mark[-2] or self.eup != mark[-1]:
            return
        own = (self._issued - mark[at("_issued")]) - (self.scalar_ops - mark[at("scalar_ops")])
        self.scalar_ops += np.where(busy, 0.0, own)

    def _bound(self, why: str) -> None:
        if why not in self.bounded:
            self.bounded.append(why)
