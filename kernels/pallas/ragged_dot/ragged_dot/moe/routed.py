"""`moe_routed_experts`: the router and the experts of a Mixture-of-Experts layer as one op.

    moe_routed_experts(x, router_weight, w_gate_up, w_down, top_k=, norm_weight=, residual=) -> (out, x + residual)

The same numbers as moe_route (the residual add, the RMSNorm, the router's top k and their softmax) followed by
moe_experts on the normalised rows. Where it pays (plan_routing), the Pallas path is one kernel a device
(pallas/routed_experts.py): the routing is computed in the experts' first grid step, so at decode the router is no
call of its own and its rows never go through HBM; that kernel reads every local expert, so it is chosen only where
nearly every expert is picked anyway (many tokens, few experts a device). Everywhere else, and on every other
implementation, the op is the two calls it stands for.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from .._vendor.chips import VMEM_BUDGET_FRACTION, chip_for_device_kind, tile_budget_bytes
from .._vendor.interpret import race_checked, resolve_interpret
from .._vendor.layer_index import layer_index
from .._vendor.platform import platform_of
from .._vendor.rms_formula import forward as rms_forward
from ..dispatch import DISPATCH, target_chip
from ..pallas.config import raised_vmem_limit
from ..pallas.routed_experts import RoutedStatic, routed_experts
from .experts import ACTIVATIONS, moe_experts, partition_specs, plan_formulation
from .formulation import block_bytes, column_tiles, padded_rows
from .route import moe_route

#: The fused kernel is chosen while the local experts nobody is expected to pick (uniform routing) stay under this:
#: each one is a whole expert's weights read for nothing, against the router call and its rows' round trip saved.
MAX_UNPICKED_EXPERTS = 0.5


def expected_unpicked(tokens: int, top_k: int, experts: int, local_experts: int) -> float:
    """Local experts no token picks, expected under uniform top-k routing: El x (1 - k/E)^T."""
    return local_experts * (1.0 - top_k / experts) ** tokens


def routed_block_bytes(t: int, h: int, ti: int, itemsize: int, experts: int, residual: bool,
                       shared_cols: int = 0) -> int:
    """VMEM one grid step of the fused kernel holds: the dense kernel's blocks, the router's weight and the norm
    rows (double-buffered), the residual and its sum when given, the experts' input and the routing (ids, weights),
    a shared MLP's three weights of `shared_cols` columns a device (double-buffered) and its output."""
    routing = 2 * (h * experts + 2 * h + experts) * itemsize + t * h * itemsize + 2 * t * 128 * 4
    shared = 2 * 3 * h * shared_cols * itemsize + 2 * t * h * itemsize if shared_cols else 0
    return block_bytes(t, h, ti, itemsize) + routing + (2 * 2 * t * h * itemsize if residual else 0) + shared


def plan_routing(tokens: int, hidden: int, inter: int, top_k: int, experts: int, local_experts: int, *,
                 chip: Any, itemsize: int = 2, residual: bool = True, activation: str = "silu",
                 gate_first: bool = True, mixed_dtypes: bool = False, pallas: bool = True, fuse: bool | None = None,
                 shared_cols: int = 0) -> tuple[bool, int | None, str]:
    """(one fused kernel?, its I tile, why) for a call of these sizes on `chip` (ChipFacts, or a device kind such as
    "TPU v6 lite"; None: off a known TPU, where the fused kernel runs only when asked for, fuse=True: interpret
    mode). A fused call the sizes refuse is a ValueError when fuse=True."""
    if isinstance(chip, str):
        chip = chip_for_device_kind(chip)
    budget = tile_budget_bytes(chip) if chip is not None else 1 << 62
    t = padded_rows(tokens)
    ti = next((c for c in column_tiles(inter, gate_first)
               if routed_block_bytes(t, hidden, c, itemsize, experts, residual, shared_cols) <= budget), None)
    refusal = None
    if not pallas:
        refusal = "not the Pallas implementation: the router and the experts as two ops"
    elif fuse is False:
        refusal = "fuse=False: the router and the experts as two ops"
    else:
        try:
            form, _, _, why = plan_formulation(tokens, hidden, inter, chip=chip, itemsize=itemsize,
                                               gate_first=gate_first, activation=activation,
                                               mixed_dtypes=mixed_dtypes, formulation="dense" if fuse else None)
        except ValueError as exc:
            form, why = "sorted", str(exc)
        if form != "dense":
            refusal = f"the experts run sorted ({why})"
        elif ti is None:
            refusal = f"the fused kernel's blocks exceed the VMEM budget for {tokens} tokens of width {hidden}"
    if refusal is None and fuse is None:
        unpicked = expected_unpicked(tokens, top_k, experts, local_experts)
        if unpicked > MAX_UNPICKED_EXPERTS:
            refusal = (f"{unpicked:.2f} of {local_experts} local experts expected unpicked by {tokens} tokens x top "
                       f"{top_k} of {experts}: the fused kernel would read them for nothing")
    if refusal is not None:
        if fuse:
            raise ValueError(f"moe_routed_experts: fuse=True cannot run here: {refusal}")
        return False, None, refusal
    unpicked = expected_unpicked(tokens, top_k, experts, local_experts)
    return True, ti, (f"one kernel: {unpicked:.2f} of {local_experts} local experts expected unpicked, every one "
                      f"read; I tile {ti}")


@dataclasses.dataclass(frozen=True)
class _Fused:
    """The fused call's static description (the jit's static argument)."""

    st: RoutedStatic
    mesh: Mesh | None
    expert_axis: str | None


def _stacked(a: jax.Array | None, stacked: bool) -> jax.Array | None:
    """A weight as the kernel reads it: stacked over layers (a stack of one without layer=)."""
    return a if a is None or stacked else a[None]


@functools.partial(jax.jit, static_argnums=(0,))
def _fused(plan: _Fused, x, residual, vectors, router, shared, w_gu, w_down, layer, extra):
    t = x.shape[0]
    tp = padded_rows(t)
    pad = lambda a: a if a is None or a.shape[0] == tp else jnp.pad(a, ((0, tp - a.shape[0]), (0, 0)))
    x, residual = pad(x), pad(residual)

    def run(x, residual, vectors, router, shared, w_gu, w_down, layer, extra):
        # this device's experts (w_down here is its shard): global ids first .. first + El - 1
        first = 0 if plan.expert_axis is None else jax.lax.axis_index(plan.expert_axis) * w_down.shape[-3]
        out, *rest = routed_experts(plan.st, x, residual, vectors, router, shared, w_gu, w_down, layer,
                                    jnp.int32(first))
        total = rest[:plan.st.residual]
        partial = rest[plan.st.residual:] + ([] if extra is None else [pad(extra)])  # summed with out
        if plan.expert_axis is not None:
            out, partial = _sum_together(out, partial, plan.expert_axis)
        return (out, *total, *partial)

    args = (x, residual, vectors, router, shared, w_gu, w_down, layer, extra)
    if plan.mesh is None:
        outs = run(*args)
    else:
        ax = plan.expert_axis
        (_, _, _, gu_spec, down_spec), _ = partition_specs(ax, stacked=True)
        shared_specs = None if shared is None else (P(None, None, ax), P(None, None, ax), P(None, ax, None))
        specs = (P(), P(), P(), P(), shared_specs, gu_spec, down_spec, P(), P(ax))
        n_out = 1 + plan.st.residual + plan.st.shared + (extra is not None)
        outs = jax.shard_map(run, mesh=plan.mesh, in_specs=specs, out_specs=(P(),) * n_out, check_vma=False)(*args)
    return tuple(o[:t] for o in outs)


def _sum_together(out: jax.Array, extra: list[jax.Array], axis: str) -> tuple[jax.Array, list[jax.Array]]:
    """(out, extra) each summed over `axis` by one all-reduce of both operands (no concatenation, no copy)."""
    out, extra = jax.lax.psum((out, extra), axis)
    return out, list(extra)


def _check_vector(name: str, a: Any, layers: int | None, width: int) -> jax.Array | None:
    if a is None:
        return None
    a = jnp.asarray(a)
    want = (width,) if layers is None else (layers, width)
    if a.shape != want:
        raise ValueError(f"moe_routed_experts: {name} must be {list(want)}, got {list(a.shape)}")
    return a


def moe_routed_experts(
    x: jax.Array,
    router_weight: jax.Array,
    w_gate_up: Any,
    w_down: jax.Array,
    *,
    top_k: int,
    norm_weight: jax.Array,
    residual: jax.Array | None = None,
    eps: float = 1e-6,
    expert_scale: jax.Array | None = None,
    expert_norm_weight: jax.Array | None = None,
    x_weight: jax.Array | None = None,
    shared_experts: tuple[jax.Array, jax.Array, jax.Array] | None = None,
    shared_norm_weight: jax.Array | None = None,
    activation: str = "silu",
    mesh: Mesh | None = None,
    expert_axis: str | None = None,
    layer: int | jax.Array | None = None,
    reduce_with: jax.Array | None = None,
    fuse: bool | None = None,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
) -> tuple[jax.Array, ...]:
    """A Mixture-of-Experts layer after its attention: the residual add, the norm, the router and the experts.

    Args:
      x: [T, H] (bf16 or f32): the rows to route (the attention's output when `residual` is the stream).
      router_weight: [H, E] ([L, H, E] with `layer`); w_gate_up, w_down: moe_experts' expert weights ([E, H, 2I]
        gate-first or a (w_gate, w_up) pair of [E, H, I], and [E, I, H]; stacked [L, ...] with `layer`).
      top_k: experts per token. norm_weight: [H] ([L, H]): the router reads RMSNorm(x (+ residual)) with it (eps).
      residual: None, or x's shape and dtype: added to x first (rounded to x's dtype), the sum returned.
      expert_scale: None, or [E] ([L, E]): each routing weight times its expert's scale (Gemma 4).
      expert_norm_weight: None (the experts read what the router reads), or [H] ([L, H]): the experts read the sum
        normalised with this weight instead (Gemma 4's pre-experts norm beside its router's).
      x_weight: None, or [H] ([L, H]): x is RMS-normalised with it before the add (a sandwich model's post-attention
        norm), as rms_norm(x_weight=) does.
      shared_experts: None, or (w_gate [H, Is], w_up [H, Is], w_down [Is, H]) ([L, ...] with `layer`): a dense MLP
        beside the experts, every token through it with weight 1 (Gemma 4's shared expert), on a mesh split over
        `expert_axis` along Is (each device's columns; P(None, axis) / P(axis, None), stacked P(None, None, axis) /
        P(None, axis, None)); its output, summed over the devices in the experts' all-reduce, is returned after
        x + residual. shared_norm_weight: None (it reads what the router reads), or [H] ([L, H]): it reads the sum
        under this norm instead.
      activation, mesh, expert_axis, layer: as moe_experts (the "psum" dispatch: every token on each device).
      reduce_with: None, or partial sums [n x T, N] of each of the n devices of `expert_axis` (rows d x T ..
        (d + 1) x T: device d's, sharded over that axis; [T, N] without a mesh), e.g. a tensor-parallel shared
        expert's: returned summed over the devices, in the experts' own all-reduce where the fused kernel runs (one
        collective for both).
      fuse: None (plan_routing decides), True (the fused kernel, a ValueError where it cannot run), False (two ops).
      implementation / interpret: the kernel contract, for both the router and the experts.

    Returns:
      (out [T, H] in x's dtype,) then x + residual when `residual` is given (what moe_route followed by moe_experts
      gives), then the shared MLP's output [T, H] when `shared_experts` is given, then reduce_with's sum [T, N]
      when it is given.
    """
    x, router_weight, w_down = jnp.asarray(x), jnp.asarray(router_weight), jnp.asarray(w_down)
    w_gu = tuple(jnp.asarray(w) for w in w_gate_up) if isinstance(w_gate_up, (tuple, list)) else jnp.asarray(w_gate_up)
    layers = None if layer is None else router_weight.shape[0]
    if x.ndim != 2 or router_weight.ndim != 2 + (layer is not None) or router_weight.shape[-2] != x.shape[1]:
        raise ValueError(f"moe_routed_experts: x must be [T, H] and router_weight [H, E] (or [L, H, E] with "
                         f"layer=); got {list(x.shape)} and {list(router_weight.shape)}")
    e, h = router_weight.shape[-1], x.shape[1]
    norm_weight = _check_vector("norm_weight", norm_weight, layers, h)
    expert_norm_weight = _check_vector("expert_norm_weight", expert_norm_weight, layers, h)
    expert_scale = _check_vector("expert_scale", expert_scale, layers, e)
    x_weight = _check_vector("x_weight", x_weight, layers, h)
    shared_norm_weight = _check_vector("shared_norm_weight", shared_norm_weight, layers, h)
    if norm_weight is None:
        raise ValueError("moe_routed_experts: norm_weight is required (the router reads the normalised rows)")
    if shared_experts is not None:
        shared_experts = tuple(jnp.asarray(w) for w in shared_experts)
        lead = () if layer is None else (layers,)
        shapes = [list(w.shape) for w in shared_experts]
        is_ = shapes[0][-1] if len(shapes) == 3 and shapes[0] else -1
        if len(shapes) != 3 or shapes != [[*lead, h, is_], [*lead, h, is_], [*lead, is_, h]]:
            raise ValueError(f"moe_routed_experts: shared_experts must be (w_gate [H, Is], w_up [H, Is], w_down "
                             f"[Is, H]) with H={h} ([L, ...] with layer=); got {shapes}")
        n_split = 1 if mesh is None or expert_axis is None else int(mesh.shape[expert_axis])
        if is_ % n_split:
            raise ValueError(f"moe_routed_experts: the shared MLP's {is_} columns do not split over "
                             f"expert_axis={expert_axis!r} of size {n_split}")
    elif shared_norm_weight is not None:
        raise ValueError("moe_routed_experts: shared_norm_weight needs shared_experts")
    if reduce_with is not None:
        reduce_with = jnp.asarray(reduce_with)
        n_dev = 1 if mesh is None or expert_axis is None else int(mesh.shape[expert_axis])
        if reduce_with.ndim != 2 or reduce_with.shape[0] != n_dev * x.shape[0]:
            raise ValueError(f"moe_routed_experts: reduce_with must be [{n_dev} x {x.shape[0]}, N] (each device's "
                             f"partial sums of the {x.shape[0]} tokens), got {list(reduce_with.shape)}")
    if w_down.ndim != 3 + (layer is not None) or w_down.shape[-3] != e:
        raise ValueError(f"moe_routed_experts: w_down must be [E, I, H] (or [L, E, I, H] with layer=) with the "
                         f"router's E={e} experts; got {list(w_down.shape)}")
    kw = {"top_k": top_k, "norm_weight": norm_weight, "residual": residual, "eps": eps,
          "expert_scale": expert_scale}
    if residual is not None:
        residual = jnp.asarray(residual)
    platform = mesh.devices.flat[0].platform if mesh is not None else platform_of((x, w_down))
    chip = chip_for_device_kind(getattr(mesh.devices.flat[0], "device_kind", None)) if mesh is not None else None
    n_e = 1 if mesh is None or expert_axis is None else int(mesh.shape[expert_axis])

    def summed() -> list[jax.Array]:
        if reduce_with is None:
            return []
        if mesh is None or expert_axis is None:
            return [reduce_with]
        psum = lambda a: jax.lax.psum(a, expert_axis)
        return [jax.shard_map(psum, mesh=mesh, in_specs=P(expert_axis), out_specs=P(), check_vma=False)(reduce_with)]

    at = None if layer is None else layer_index(layer, layers, "moe_routed_experts")
    of_layer = lambda w: w if at is None else w[at]

    def shared_mlp(xs: jax.Array) -> jax.Array:
        """The shared MLP in XLA (f32 accumulation), summed over the expert axis on a mesh."""
        act = ACTIVATIONS[activation]
        prec = jax.lax.Precision.HIGHEST if xs.dtype == jnp.float32 else None
        dot = functools.partial(jnp.matmul, precision=prec, preferred_element_type=jnp.float32)

        def local(xs, g, u, d):
            a = (act(dot(xs, g)) * dot(xs, u)).astype(xs.dtype)
            part = dot(a, d)
            return part if mesh is None or expert_axis is None else jax.lax.psum(part, expert_axis)

        g, u, d = (of_layer(w) for w in shared_experts)
        if mesh is None or expert_axis is None:
            return local(xs, g, u, d).astype(xs.dtype)
        ax = expert_axis
        specs = (P(), P(None, ax), P(None, ax), P(ax, None))
        return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False)(xs, g, u, d
                                                                                             ).astype(xs.dtype)

    def two_ops(name: str, mode: Any) -> tuple[jax.Array, ...]:
        contract = {"implementation": name, "interpret": mode if name == "pallas" else None}
        xx = x if x_weight is None else rms_forward(x, of_layer(x_weight), eps=float(eps))
        ids, wts, y, *total = moe_route(xx, router_weight, layer=layer, **kw, **contract)
        summed_x = total[0] if total else xx
        xin = y if expert_norm_weight is None else rms_forward(summed_x, of_layer(expert_norm_weight), eps=float(eps))
        out = moe_experts(xin, ids, wts, w_gu, w_down, activation=activation, mesh=mesh, expert_axis=expert_axis,
                          layer=layer, **contract)
        shared = []
        if shared_experts is not None:
            xs = y if shared_norm_weight is None else rms_forward(summed_x, of_layer(shared_norm_weight),
                                                                  eps=float(eps))
            shared = [shared_mlp(xs)]
        return (out, *total, *shared, *summed())

    shared_cols = 0 if shared_experts is None else shared_experts[0].shape[-1] // n_e
    mode = resolve_interpret(interpret, platform)
    on = chip if chip is not None or mode else target_chip(mode)
    fused, ti, why = plan_routing(x.shape[0], h, w_down.shape[-2], top_k, e, w_down.shape[-3] // n_e,
                                  chip=None if mode else on, itemsize=jnp.dtype(x.dtype).itemsize,
                                  residual=residual is not None, activation=activation,
                                  gate_first=not isinstance(w_gu, tuple),
                                  mixed_dtypes=jnp.dtype(x.dtype) != jnp.dtype(w_down.dtype),
                                  pallas=x.shape[0] > 0, fuse=fuse, shared_cols=shared_cols)

    def call(name: str) -> tuple[jax.Array, ...]:
        if name != "pallas" or not fused:
            return two_ops(name, mode if name == "pallas" else None)
        return race_checked(mode, (x, w_down), lambda: _fused_call(ti, mode, on), "the routed experts kernel")

    def _fused_call(ti: int, mode: Any, on: Any) -> tuple[jax.Array, ...]:
        # the two ops' own checks (the two-op path runs them itself), traced only
        jax.eval_shape(lambda: moe_route(x, router_weight, layer=layer, implementation="xla", **kw))
        ids = jnp.zeros((x.shape[0], top_k), jnp.int32)
        jax.eval_shape(lambda: moe_experts(x, ids, ids.astype(jnp.float32), w_gu, w_down, activation=activation,
                                           mesh=mesh, expert_axis=expert_axis, layer=layer, implementation="xla"))
        stacked = layer is not None
        at = jnp.int32(0) if layer is None else layer_index(layer, layers, "moe_routed_experts")
        itemsize = jnp.dtype(x.dtype).itemsize
        need = routed_block_bytes(padded_rows(x.shape[0]), h, ti, itemsize, e, residual is not None, shared_cols)
        vmem = (raised_vmem_limit(on) if on is not None and not mode
                and need > on.scoped_vmem_bytes * VMEM_BUDGET_FRACTION else None)
        st = RoutedStatic(top_k, float(eps), residual is not None, expert_scale is not None,
                          expert_norm_weight is not None, ti, ACTIVATIONS[activation], activation, mode, vmem,
                          x_norm=x_weight is not None, shared=shared_experts is not None,
                          shared_norm=shared_norm_weight is not None)
        plan = _Fused(st, mesh, expert_axis if mesh is not None else None)
        gu = tuple(_stacked(w, stacked) for w in w_gu) if isinstance(w_gu, tuple) else _stacked(w_gu, stacked)
        scale = None if expert_scale is None else expert_scale.astype(jnp.float32)
        given = {"norm": norm_weight, "expert_norm": expert_norm_weight, "scale": scale, "x_norm": x_weight,
                 "shared_norm": shared_norm_weight}
        vectors = {name: _stacked(given[name], stacked) for name in st.vectors()}
        shared = None if shared_experts is None else tuple(_stacked(w, stacked) for w in shared_experts)
        return _fused(plan, x, residual, vectors, _stacked(router_weight, stacked), shared, gu,
                      _stacked(w_down, stacked), at, reduce_with)

    first, _ = DISPATCH.resolve_implementation(platform, implementation, interpret=interpret)
    note = f"routing: {why}" if first == "pallas" else None
    return DISPATCH.run(platform, implementation, interpret, call, note=note)
