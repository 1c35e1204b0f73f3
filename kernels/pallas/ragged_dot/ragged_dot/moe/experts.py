"""A Mixture-of-Experts expert block on the ragged dot, on one device or expert-parallel over a device mesh.

    moe_experts(x[T,H], topk_ids[T,k], topk_weights[T,k], w_gate_up[E,H,2I], w_down[E,I,H]) -> [T,H]

Gate-first layout: w_gate_up[..., :I] is the gate projection, w_gate_up[..., I:] the up projection (transformers'
Qwen/Mixtral/Gemma layout, transposed to [E, H, 2I]). out[t] = sum_j topk_weights[t,j] * expert_{ids[t,j]}(x[t]),
expert_e(v) = (act(v @ Wg_e) * (v @ Wu_e)) @ Wd_e.

One device: (token, slot) rows sorted by expert, two ragged dots through this package's `ragged_dot` (the same
implementation= / interpret= contract), the gate in f32, each row's routing weight on its gated activation, the
rows summed back per token in f32. On a mesh, experts are split
over `expert_axis` (E/e per device, rows of other devices' experts sort last, past the ragged dot's groups: they
cost no weight reads) and the dispatch scheme of plan.py moves tokens; `tensor_axis` splits I (each device
holds matching slices of gate, up and down, so the gate needs no communication; the partial outputs are summed).
Everything runs under one jax.jit with static options, inside a jax.shard_map with check_vma=False (the CPU path's
overflow loop has no varying-manual-axes rule; gradients are still right, tests/test_moe_mesh.py checks them).

With `layer=`, the weights are stacked over layers ([L, E, ...], experts on dim 1) and both ragged dots read
layer `layer` of the stacks in place (ragged_dot's layer=), so a model's layers can run as a scan over a counter
with the stacks passed whole: no per-layer copy of the experts' weights.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from .._vendor.chips import VMEM_BUDGET_FRACTION, ChipFacts, chip_for_device_kind, tile_budget_bytes
from .._vendor.interpret import resolve_interpret
from .._vendor.platform import platform_of
from ..api import implementations_for, ragged_dot
from ..dispatch import target_chip
from ..pallas.config import raised_vmem_limit
from .dense import dense_local
from .formulation import DenseCall, block_bytes, choose_formulation, dense_tile, padded_rows
from .plan import SCHEMES, MoeSizes, choose_scheme, rows_per_device
from .quant import Scales, check_scales, check_tensor_split, scale_specs, split_gate_up_scale

#: Gate activations by name. "gelu" is jax.nn.gelu's default, the tanh approximation: what Gemma 4's config calls
#: `gelu_pytorch_tanh`; "gelu_exact" is the erf form (torch's F.gelu default).
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_exact": functools.partial(jax.nn.gelu, approximate=False),
    "relu": jax.nn.relu,
}


#: w_gate_up: one [E, H, 2I] array, gate-first, or a (w_gate, w_up) pair of [E, H, I] (what a tensor split needs).
GateUp = Any


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Static description of one call: hashable, the jit's static argument."""

    activation: str
    mesh: Mesh | None
    expert_axis: str | None
    tensor_axis: str | None
    scheme: str
    rows: int  # rows each device runs (psum / all_gather), or rows per destination x sources (all_to_all)
    implementation: str | tuple[str, ...]
    interpret: Any
    formulation: str = "sorted"  # moe/formulation.py
    dense_ti: int | None = None  # the dense kernel's I tile
    dense_vmem: int | None = None  # its scoped-VMEM limit (None: the compiler's default)

    def axis_size(self, axis: str | None) -> int:
        return 1 if axis is None or self.mesh is None else int(self.mesh.shape[axis])


# ---- the per-device work ---------------------------------------------------------------------------------------


def _local_experts(w_gu: GateUp) -> int:
    return (w_gu[0] if isinstance(w_gu, tuple) else w_gu).shape[-3]


def _experts_on_sorted(plan: _Plan, xs: jax.Array, sizes: jax.Array, w_gu: GateUp, w_down: jax.Array,
                       row_weights: jax.Array | None = None, scales: Scales = (None, None),
                       layer: jax.Array | None = None) -> jax.Array:
    """Rows already grouped by local expert (sizes[g] rows of expert g, then rows of no group) -> expert outputs,
    zeros for rows past the groups. w_gu [El, H, 2Il] gate-first (one ragged dot) or a (gate, up) pair of
    [El, H, Il] (two), w_down [El, Il, H]. row_weights [rows] (f32) scale each row's gated activation before the
    down projection (the same product as scaling the output, on I columns instead of H). `scales`: the quantized
    weights' scales (moe/quant.py), shaped like the weights they belong to. `layer`: the weights are stacked
    [L, ...] and this layer of them is read in place."""
    il = w_down.shape[-2]
    run = functools.partial(ragged_dot, implementation=plan.implementation, interpret=plan.interpret)
    if layer is not None:
        run = functools.partial(run, layer=layer)
    s_gu, s_down = scales
    if isinstance(w_gu, tuple):
        s_g, s_u = s_gu if s_gu is not None else (None, None)
        gate, up = run(xs, w_gu[0], sizes, rhs_scale=s_g), run(xs, w_gu[1], sizes, rhs_scale=s_u)
    else:
        h = run(xs, w_gu, sizes, rhs_scale=s_gu)
        gate, up = h[:, :il], h[:, il:]
    a = ACTIVATIONS[plan.activation](gate.astype(jnp.float32)) * up.astype(jnp.float32)
    if row_weights is not None:
        a = a * row_weights[:, None]
    return run(a.astype(gate.dtype), w_down, sizes, rhs_scale=s_down)


def _group(key: jax.Array, groups: int, rows: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(order, sizes, kept): the first `rows` row indices sorted by key (key == groups: no group, sorts last),
    the group sizes of those rows, and which of them belong to a group."""
    order = jnp.argsort(key, stable=True)[:rows]
    sorted_key = key[order]
    sizes = jnp.bincount(sorted_key, length=groups + 1)[:groups].astype(jnp.int32)
    return order, sizes, sorted_key < groups


def _local_rows(plan: _Plan, x: jax.Array, ids: jax.Array, weights: jax.Array, w_gu: GateUp,
                w_down: jax.Array, first: jax.Array, rows: int, scales: Scales = (None, None),
                layer: jax.Array | None = None) -> jax.Array:
    """Partial [T, H] output of this device's experts (global ids first .. first+El-1) over every token: f32 when
    sorted, x's dtype (summed in f32) when dense."""
    if plan.formulation == "dense":
        names = plan.implementation if isinstance(plan.implementation, tuple) else (plan.implementation,)
        sorted_plan = dataclasses.replace(plan, formulation="sorted")
        sorted_rows = functools.partial(_sorted_rows, sorted_plan, rows=rows, scales=scales)
        return dense_local(x, ids, weights, w_gu, w_down, first, activation=ACTIVATIONS[plan.activation],
                           pallas=names[0] == "pallas", ti=plan.dense_ti, vmem_limit=plan.dense_vmem,
                           interpret=plan.interpret, sorted_rows=sorted_rows, layer=layer)
    t, k = ids.shape
    el = _local_experts(w_gu)
    local = ids.reshape(-1).astype(jnp.int32) - first
    key = jnp.where((local >= 0) & (local < el), local, el)
    order, sizes, kept = _group(key, el, rows)
    tok = order // k
    w = jnp.where(kept, weights.reshape(-1)[order].astype(jnp.float32), 0.0)
    y = _experts_on_sorted(plan, x[tok], sizes, w_gu, w_down, w, scales, layer)
    return jnp.zeros((t, x.shape[1]), jnp.float32).at[tok].add(y.astype(jnp.float32))


def _sorted_rows(plan: _Plan, x, ids, weights, w_gu, w_down, first, layer, *, rows: int, scales: Scales):
    """_local_rows of the sorted formulation, in the argument order the dense kernel's gradient calls it with."""
    return _local_rows(plan, x, ids, weights, w_gu, w_down, first, rows, scales, layer)


def _first_expert(plan: _Plan, experts_here: int) -> jax.Array:
    if plan.expert_axis is None:
        return jnp.int32(0)
    return (jax.lax.axis_index(plan.expert_axis) * experts_here).astype(jnp.int32)


def _reduce_axes(plan: _Plan) -> tuple[str, ...]:
    return tuple(a for a in (plan.expert_axis, plan.tensor_axis) if a is not None)


# ---- the schemes (shard_map bodies) ----------------------------------------------------------------------------


def _psum_body(plan: _Plan, x, ids, weights, w_gu, w_down, scales=(None, None), layer=None):
    part = _local_rows(plan, x, ids, weights, w_gu, w_down, _first_expert(plan, _local_experts(w_gu)), plan.rows,
                       scales, layer)
    return jax.lax.psum(part.astype(x.dtype), _reduce_axes(plan))


def _all_gather_body(plan: _Plan, x, ids, weights, w_gu, w_down, scales=(None, None), layer=None):
    ea = plan.expert_axis
    x_all, ids_all, w_all = (jax.lax.all_gather(a, ea, tiled=True) for a in (x, ids, weights))
    part = _local_rows(plan, x_all, ids_all, w_all, w_gu, w_down, _first_expert(plan, _local_experts(w_gu)),
                       plan.rows, scales, layer)
    if plan.tensor_axis is not None:
        part = jax.lax.psum(part, plan.tensor_axis)
    return jax.lax.psum_scatter(part.astype(x.dtype), ea, scatter_dimension=0, tiled=True)


def _all_to_all_body(plan: _Plan, x, ids, weights, w_gu, w_down, scales=(None, None), layer=None):
    ea, n = plan.expert_axis, plan.axis_size(plan.expert_axis)
    el, hidden = _local_experts(w_gu), x.shape[1]
    cap = plan.rows // n
    tl, k = ids.shape
    flat = ids.reshape(-1).astype(jnp.int32)
    dest = jnp.minimum(flat // el, n)  # ids >= E (padding tokens) go nowhere
    order = jnp.argsort(flat, stable=True)  # by expert, so by destination
    sdest = dest[order]
    counts = jnp.bincount(sdest, length=n + 1)[:n]
    starts = jnp.cumsum(counts) - counts
    rank = jnp.arange(tl * k, dtype=jnp.int32) - starts[jnp.minimum(sdest, n - 1)]
    keep = (sdest < n) & (rank < cap)
    slot = jnp.where(keep, sdest * cap + rank, n * cap)  # n * cap: a spill slot cut off below
    send_x = jnp.zeros((n * cap + 1, hidden), x.dtype).at[slot].set(x[order // k])[:-1]
    send_e = jnp.full((n * cap + 1,), el, jnp.int32).at[slot].set(flat[order] % el)[:-1]
    swap = lambda a: jax.lax.all_to_all(a.reshape(n, cap, *a.shape[1:]), ea, 0, 0, tiled=True).reshape(a.shape)
    recv_x, recv_e = swap(send_x), swap(send_e)
    r_order, sizes, _ = _group(recv_e, el, n * cap)
    y_sorted = _experts_on_sorted(plan, recv_x[r_order], sizes, w_gu, w_down, scales=scales, layer=layer)
    y = jnp.zeros_like(y_sorted).at[r_order].set(y_sorted)  # back to the received layout
    back = jnp.concatenate([swap(y), jnp.zeros((1, hidden), y.dtype)])[slot]
    w = jnp.where(keep, weights.reshape(-1)[order].astype(jnp.float32), 0.0)
    out = jnp.zeros((tl, hidden), jnp.float32).at[order // k].add(back.astype(jnp.float32) * w[:, None])
    if plan.tensor_axis is not None:
        out = jax.lax.psum(out, plan.tensor_axis)
    return out.astype(x.dtype)


_BODIES = {"psum": _psum_body, "all_gather": _all_gather_body, "all_to_all": _all_to_all_body}


def partition_specs(expert_axis: str | None, tensor_axis: str | None = None, scheme: str = "psum",
                    stacked: bool = False) -> tuple[tuple[Any, ...], P]:
    """(specs of x, topk_ids, topk_weights, w_gate_up, w_down; spec of the output) for a scheme.

    Tokens are replicated for "psum" and split over the expert axis otherwise. Without a tensor axis w_gate_up is
    one [E,H,2I] array, P(expert_axis, None, None); with one it is the (w_gate, w_up) pair of [E,H,I], each
    P(expert_axis, None, tensor_axis), so every device holds matching gate and up columns. w_down [E,I,H] is
    P(expert_axis, tensor_axis, None). stacked: the weights stacked over layers (moe_experts' layer=), each spec
    with an unsplit layer dimension first."""
    tok = P() if scheme == "psum" else P(expert_axis)
    lead = (None,) if stacked else ()
    gate_up: Any = (P(*lead, expert_axis, None, None) if tensor_axis is None
                    else (P(*lead, expert_axis, None, tensor_axis),) * 2)
    return (tok, tok, tok, gate_up, P(*lead, expert_axis, tensor_axis, None)), tok


@functools.partial(jax.jit, static_argnums=(0,))
def _moe(plan: _Plan, x, ids, weights, w_gu: GateUp, w_down, scales: Scales = (None, None), layer=None):
    if plan.tensor_axis is not None and not isinstance(w_gu, tuple):  # a copy per call: pass the pair instead
        i = w_down.shape[-2]
        scales = (split_gate_up_scale(scales[0], w_gu, i), scales[1])
        w_gu = (w_gu[..., :i], w_gu[..., i:])
    if plan.mesh is None:
        return _local_rows(plan, x, ids, weights, w_gu, w_down, jnp.int32(0), plan.rows, scales,
                           layer).astype(x.dtype)
    t = x.shape[0]
    if plan.scheme != "psum":  # tokens split over the expert axis: pad to a multiple of it with tokens routed nowhere
        pad = -t % plan.axis_size(plan.expert_axis)
        x = jnp.pad(x, ((0, pad), (0, 0)))
        ids = jnp.pad(ids, ((0, pad), (0, 0)), constant_values=w_down.shape[-3])
        weights = jnp.pad(weights, ((0, pad), (0, 0)))
    in_specs, out_spec = partition_specs(plan.expert_axis, plan.tensor_axis, plan.scheme, layer is not None)
    args = (x, ids, weights, w_gu, w_down)
    if scales != (None, None):  # quantized weights: their scales shard with them
        in_specs, args = (*in_specs, scale_specs(scales, w_down, plan.expert_axis, plan.tensor_axis)), (*args, scales)
    body = functools.partial(_BODIES[plan.scheme], plan)
    if layer is not None:  # the layer index, replicated: every device reads that layer of its experts' stacks
        in_specs, args = (*in_specs, P()), (*args, layer)
        body = functools.partial(_stacked_body, _BODIES[plan.scheme], plan)
    out = jax.shard_map(body, mesh=plan.mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)(*args)
    return out[:t]


def _stacked_body(body: Callable[..., Any], plan: _Plan, x, ids, weights, w_gu, w_down, layer):
    return body(plan, x, ids, weights, w_gu, w_down, layer=layer)


# ---- the entry -------------------------------------------------------------------------------------------------


def _as_gate_up(w_gate_up: Any) -> GateUp:
    if isinstance(w_gate_up, (tuple, list)):
        if len(w_gate_up) != 2:
            raise ValueError(f"w_gate_up as a pair is (w_gate, w_up); got {len(w_gate_up)} arrays")
        return tuple(jnp.asarray(w) for w in w_gate_up)
    return jnp.asarray(w_gate_up)


def _check(x, ids, weights, w_gu: GateUp, w_down, activation: str) -> tuple[int, int, int, int]:
    """(T, k, E, I), or a ValueError/TypeError naming the operand to fix."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    if x.ndim != 2 or ids.ndim != 2 or weights.shape != ids.shape or ids.shape[0] != x.shape[0]:
        raise ValueError(f"moe_experts wants x [T,H], topk_ids [T,k], topk_weights [T,k]; got {x.shape}, "
                         f"{ids.shape}, {weights.shape}")
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise TypeError(f"topk_ids must be integers, got {ids.dtype}")
    e, h = w_down.shape[0] if w_down.ndim == 3 else -1, x.shape[1]
    i = w_down.shape[1] if w_down.ndim == 3 else -1
    if isinstance(w_gu, tuple):
        gu_ok, got = all(w.shape == (e, h, i) for w in w_gu), " and ".join(str(w.shape) for w in w_gu)
    else:
        gu_ok, got = w_gu.shape == (e, h, 2 * i), str(w_gu.shape)
    if w_down.ndim != 3 or w_down.shape != (e, i, h) or not gu_ok:
        raise ValueError(f"moe_experts wants w_gate_up [E,H,2I] (or a (w_gate, w_up) pair of [E,H,I]) and w_down "
                         f"[E,I,H] with H={h}; got w_gate_up {got} and w_down {w_down.shape}")
    return x.shape[0], ids.shape[1], e, i


def _one_layer(w_gu: GateUp, w_down: jax.Array, layer: Any, quantized: bool) -> tuple[GateUp, Any, jax.Array]:
    """(stand-ins of one layer's w_gate_up and w_down, shapes only, for the checks; the layer as an int32 scalar)
    for weights stacked over layers, or a ValueError naming what to fix."""
    if quantized:
        raise ValueError("moe_experts: layer= takes unquantized weights only; pass w[layer] with its scales")
    layer = jnp.asarray(layer)
    if layer.ndim != 0 or not jnp.issubdtype(layer.dtype, jnp.integer):
        raise ValueError(f"moe_experts: layer= must be an integer scalar, got {layer.shape} {layer.dtype}")
    stacks = (*(w_gu if isinstance(w_gu, tuple) else (w_gu,)), w_down)
    if any(w.ndim != 4 for w in stacks) or len({w.shape[0] for w in stacks}) != 1:
        raise ValueError("moe_experts: layer= needs w_gate_up [L,E,H,2I] (or a pair of [L,E,H,I]) and w_down "
                         f"[L,E,I,H] stacked over the same layers; got {[w.shape for w in stacks]}")
    if not isinstance(layer, jax.core.Tracer) and not 0 <= int(layer) < w_down.shape[0]:
        raise ValueError(f"moe_experts: layer {int(layer)} is outside the stack's {w_down.shape[0]} layers")
    one = lambda w: jax.ShapeDtypeStruct(w.shape[1:], w.dtype)
    gu = tuple(one(w) for w in w_gu) if isinstance(w_gu, tuple) else one(w_gu)
    return gu, one(w_down), layer.astype(jnp.int32)


def _mesh_axes(mesh: Mesh | None, expert_axis: str | None, tensor_axis: str | None, e: int, i: int) -> None:
    if mesh is None:
        if expert_axis is not None or tensor_axis is not None:
            raise ValueError("expert_axis / tensor_axis need a mesh")
        return
    if expert_axis is None and tensor_axis is None:
        raise ValueError("a mesh needs expert_axis and/or tensor_axis")
    for name, axis, dim, what in ((("expert_axis", expert_axis, e, "experts")), ("tensor_axis", tensor_axis, i,
                                                                                  "intermediate size")):
        if axis is None:
            continue
        if axis not in mesh.shape:
            raise ValueError(f"{name}={axis!r} is not an axis of the mesh {dict(mesh.shape)}")
        if dim % mesh.shape[axis]:
            raise ValueError(f"{dim} {what} do not split evenly over {name}={axis!r} of size {mesh.shape[axis]}")
    if expert_axis is not None and expert_axis == tensor_axis:
        raise ValueError("expert_axis and tensor_axis must be different mesh axes")


def moe_device_work(x: jax.Array, topk_ids: jax.Array, topk_weights: jax.Array, w_gate_up: GateUp,
                    w_down: jax.Array, *, first_expert: int = 0, rows: int | None = None, activation: str = "silu",
                    implementation: str | Sequence[str] = ("pallas",), interpret: Any = False,
                    w_gate_up_scale: Any = None, w_down_scale: Any = None) -> jax.Array:
    """What one device of the "psum" scheme computes: its experts first_expert .. first_expert + El - 1 (w_gate_up
    [El,H,2Il] gate-first, w_down [El,Il,H]: its local slices) over every token, as a partial [T,H] f32 sum before
    the psum (a (gate, up) pair of [El,H,Il] slices under a tensor split). `rows` (default T x k) is
    rows_per_device. Defaults lower the Pallas kernel to Mosaic: kernel-hub's TPU cost model walks this function's
    kernels with a real routing."""
    topk_ids, topk_weights = jnp.asarray(topk_ids), jnp.asarray(topk_weights)
    t, k = topk_ids.shape
    names = implementation if isinstance(implementation, str) else tuple(implementation)
    plan = _Plan(activation, None, None, None, "psum", rows or t * k, names, interpret)
    w_gu = _as_gate_up(w_gate_up)
    scales = check_scales(x, w_gu, w_down, w_gate_up_scale, w_down_scale)
    return _local_rows(plan, x, topk_ids, topk_weights, w_gu, w_down, jnp.int32(first_expert), plan.rows, scales)


def plan_dispatch(tokens: int, hidden: int, top_k: int, experts: int, *, expert_devices: int, tensor_devices: int = 1,
                  itemsize: int = 2, dispatch: str | None = None, capacity_factor: float | None = None
                  ) -> tuple[str, int, str]:
    """(scheme, rows per device, why): the decisions moe_experts takes for these sizes (see plan.py)."""
    sizes = MoeSizes(tokens, hidden, top_k, experts, expert_devices, tensor_devices, itemsize)
    if dispatch is None:
        scheme, why = choose_scheme(sizes, capacity_factor)
    elif dispatch in SCHEMES:
        scheme, why = dispatch, f"{dispatch}: requested"
    else:
        raise ValueError(f"unknown dispatch {dispatch!r}; known: {', '.join(SCHEMES)}")
    rows, rows_why = rows_per_device(scheme, sizes, capacity_factor)
    return scheme, rows, f"{why}; rows per device: {rows_why}"


def plan_formulation(tokens: int, hidden: int, inter: int, *, chip: ChipFacts | None, itemsize: int = 2,
                     gate_first: bool = True, quantized: bool = False, scheme: str = "psum", pallas: bool = True,
                     mixed_dtypes: bool = False, activation: str = "silu", formulation: str | None = None
                     ) -> tuple[str, int | None, int | None, str]:
    """(formulation, the dense kernel's I tile, its scoped-VMEM limit or None, why): how one device runs its
    experts (moe/formulation.py), for T tokens on it, its experts' I, on `chip` (None: off a known TPU)."""
    budget = tile_budget_bytes(chip) if chip is not None else 1 << 62
    call = DenseCall(tokens, hidden, inter, itemsize, chip.name if chip is not None else None, budget, gate_first,
                     quantized, scheme, pallas, mixed_dtypes, activation)
    name, why = choose_formulation(call, formulation)
    if name != "dense":
        return name, None, None, why
    ti = dense_tile(call)
    if ti is None:
        raise ValueError(f"formulation='dense': even its smallest blocks exceed {call.chip}'s VMEM budget for "
                         f"{tokens} tokens of width {hidden}; use formulation='sorted'")
    need = block_bytes(padded_rows(tokens), hidden, ti, itemsize)
    limit = None
    if chip is not None and need > chip.scoped_vmem_bytes * VMEM_BUDGET_FRACTION:
        limit = raised_vmem_limit(chip)
    return name, ti, limit, f"{why}; I tile {ti}"


def moe_experts(
    x: jax.Array,
    topk_ids: jax.Array,
    topk_weights: jax.Array,
    w_gate_up: GateUp,
    w_down: jax.Array,
    *,
    activation: str = "silu",
    mesh: Mesh | None = None,
    expert_axis: str | None = None,
    tensor_axis: str | None = None,
    dispatch: str | None = None,
    capacity_factor: float | None = None,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
    w_gate_up_scale: Any = None,
    w_down_scale: Any = None,
    layer: Any = None,
    formulation: str | None = None,
) -> jax.Array:
    """Mixture-of-Experts expert block: out[t] = sum_j topk_weights[t,j] * expert_{topk_ids[t,j]}(x[t]).

    x [T,H]; topk_ids [T,k] int (ids outside [0, E) contribute nothing); topk_weights [T,k];
    w_gate_up [E,H,2I] gate-first ([..., :I] gate, [..., I:] up), or the same as a (w_gate, w_up) pair of [E,H,I];
    w_down [E,I,H]. Result [T,H] in x's dtype. Differentiable in x, topk_weights and the weights (bf16 and f32).

    activation: a name of ACTIVATIONS ("silu"; "gelu" is the tanh approximation Gemma 4 uses).
    mesh, expert_axis: split the experts over that mesh axis (E/e per device); tokens reach their experts by
      `dispatch` ("psum", "all_gather", "all_to_all"; None: the fewest bytes, see plan_dispatch). tensor_axis:
      also split I over that axis; give w_gate_up as the (w_gate, w_up) pair then, each sharded
      P(expert_axis, None, tensor_axis) (a single [E,H,2I] array is split into the pair on every call, a copy).
      partition_specs(expert_axis, tensor_axis, scheme) gives every operand's spec.
    capacity_factor: None runs every row exactly; a factor keeps that multiple of each device's fair share of rows
      and drops the rest (zero contribution). Only with an expert axis.
    implementation, interpret: the ragged dot's contract; the platform is the mesh's devices when a mesh is given,
      else where the operands live, so an ahead-of-time compile for a mock TPU mesh takes the Pallas path.
    w_gate_up_scale, w_down_scale: quantized expert weights (int8 with per-channel scales [E, 1, N], or
      float8_e4m3fn with 128x128 block scales [E, ceil(K/128), ceil(N/128)], N and K of that weight; a pair for a
      (w_gate, w_up) pair); they shard with their weights (moe/quant.py). Gradients then flow to x and
      topk_weights only: quantized weights and their scales get zero cotangents.
    layer: an integer scalar (may be traced, e.g. a scan's counter) when the weights are stacked over layers:
      w_gate_up [L,E,H,2I] (or a pair of [L,E,H,I]), w_down [L,E,I,H]; the result is moe_experts on w[layer], the
      Pallas ragged dots reading that layer of the stacks in place (no copy of a layer's experts). On a mesh the
      experts (dim 1) split over expert_axis: partition_specs(..., stacked=True). Forward only; unquantized weights
      only; with tensor_axis, give w_gate_up as the pair.
    formulation: how each device runs its experts: "sorted" (rows sorted by expert through two ragged dots) or
      "dense" (every token through each local expert some token picked, one Pallas kernel: decode sizes); None
      chooses (plan_formulation: dense on a known TPU while the tokens fit the MXU's rows, with the "psum"
      dispatch and unquantized weights).
    """
    x, topk_ids, topk_weights, w_down = (jnp.asarray(a) for a in (x, topk_ids, topk_weights, w_down))
    w_gu = _as_gate_up(w_gate_up)
    checked_gu, checked_down = w_gu, w_down
    if layer is not None:
        quantized = w_gate_up_scale is not None or w_down_scale is not None
        checked_gu, checked_down, layer = _one_layer(w_gu, w_down, layer, quantized)
        if tensor_axis is not None and not isinstance(w_gu, tuple):
            raise ValueError("moe_experts: layer= with tensor_axis needs w_gate_up as a (w_gate, w_up) pair "
                             "(splitting one stacked array would copy every layer)")
    t, k, e, i = _check(x, topk_ids, topk_weights, checked_gu, checked_down, activation)
    _mesh_axes(mesh, expert_axis, tensor_axis, e, i)
    scales = (None, None) if layer is not None else check_scales(x, w_gu, w_down, w_gate_up_scale, w_down_scale)
    platform = mesh.devices.flat[0].platform if mesh is not None else platform_of((x, w_gu, w_down))
    names = implementations_for(platform) if implementation is None else implementation
    names = names if isinstance(names, str) else tuple(names)
    n_e = 1 if mesh is None or expert_axis is None else int(mesh.shape[expert_axis])
    n_t = 1 if mesh is None or tensor_axis is None else int(mesh.shape[tensor_axis])
    check_tensor_split(checked_gu, checked_down, scales, n_t)
    if mesh is None or expert_axis is None:
        if dispatch not in (None, "psum") or capacity_factor is not None:
            raise ValueError("dispatch= and capacity_factor= need a mesh with an expert_axis")
        scheme, rows = "psum", t * k
    else:
        scheme, rows, _ = plan_dispatch(t, x.shape[1], k, e, expert_devices=n_e, tensor_devices=n_t,
                                        itemsize=jnp.dtype(x.dtype).itemsize, dispatch=dispatch,
                                        capacity_factor=capacity_factor)
    interp = resolve_interpret(interpret, platform)
    chip = (chip_for_device_kind(getattr(mesh.devices.flat[0], "device_kind", None)) if mesh is not None
            else target_chip(interp))
    first_name = names if isinstance(names, str) else names[0]
    form, ti, vmem, _ = plan_formulation(
        t, x.shape[1], i // n_t, chip=None if interp else chip, itemsize=jnp.dtype(x.dtype).itemsize,
        gate_first=not isinstance(w_gu, tuple), quantized=any(s is not None for s in scales), scheme=scheme,
        pallas=first_name == "pallas", mixed_dtypes=jnp.dtype(x.dtype) != jnp.dtype(w_down.dtype),
        activation=activation, formulation=formulation)
    plan = _Plan(activation, mesh, expert_axis, tensor_axis, scheme, rows, names, interp, form, ti, vmem)
    return _moe(plan, x, topk_ids, topk_weights, w_gu, w_down, scales, layer)
