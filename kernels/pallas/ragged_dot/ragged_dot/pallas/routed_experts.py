"""Pallas TPU (Mosaic) kernel: the router and a device's experts in one call, every local expert read.

    routed_experts(st, x [T,H], residual, vectors, router [L,H,E], shared, w_gate_up, w_down, layer, first)
        -> out [T,H] (, x + residual) (, the shared MLP's output)

Grid (El, I tiles), like the dense experts kernel (dense_experts.py), with the routing done in its first step:
x's own norm where given, the residual add and the router's RMSNorm (route.normed_input), the router's f32 logits
and their top k with the softmax over those k (route.top_k_softmax), kept in VMEM, and a shared MLP where given
(every token, weight 1); then step (s, j) runs local expert s (global id first + s) on I columns j, every token
weighted by what it gives that expert (0 where it did not pick it), and the sum is written in x's dtype after the
last step.

Why: at decode the router is its own call between the attention's all-reduce and the experts (a few microseconds
of fixed cost and a round trip of the rows through HBM), and the experts cannot start before it ends. Here the
routing is computed where the experts run. The price: the experts' weight blocks are fetched by the pipeline before
the routing is known, so every local expert is read, picked or not; that pays only where nearly every expert is
picked (moe/routed.py decides), as at decode with a large batch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._vendor.rms_formula import forward as rms_forward
from .dense_experts import expert_step, weight_specs
from .route import LANES, RouteStatic, normed_input, top_k_softmax


@dataclasses.dataclass(frozen=True)
class RoutedStatic:
    """What the call is, beside its arrays."""

    top_k: int
    eps: float
    residual: bool  # a residual stream is added to x before the norm, the sum a second output
    scaled: bool  # the routing weights are multiplied by a per-expert scale at their ids
    expert_norm: bool  # the experts read the sum normalised by a norm weight of their own (else the router's input)
    ti: int
    activation: Callable = dataclasses.field(compare=False, hash=False, default=None)
    activation_name: str = "silu"
    interpret: object = False
    vmem_limit_bytes: int | None = None
    x_norm: bool = False  # x is RMS-normalised by a weight of its own before the add (a sandwich post-norm)
    shared: bool = False  # a dense MLP beside the experts (every token, weight 1), its output a last output
    shared_norm: bool = False  # the shared MLP reads the sum under a norm of its own (else the router's input)

    def vectors(self) -> tuple[str, ...]:
        """The per-layer vector stacks the call takes, in operand order."""
        flags = (("norm", True), ("expert_norm", self.expert_norm), ("scale", self.scaled),
                 ("x_norm", self.x_norm), ("shared_norm", self.shared_norm))
        return tuple(name for name, on in flags if on)


def _row(stack: jax.Array, layer: jax.Array) -> jax.Array:
    """[1, N] float32: row `layer` of a stack [L, N] in VMEM (a select and a sublane sum: no dynamic sublane index)."""
    rows = jax.lax.broadcasted_iota(jnp.int32, stack.shape, 0)
    return jnp.sum(jnp.where(rows == layer, stack.astype(jnp.float32), 0.0), axis=0, keepdims=True)


def _kernel(layer_ref, first_ref, *refs, st: RoutedStatic, nj: int, n_w: int, split: int | None,
            precision: jax.lax.Precision | None) -> None:
    refs = list(refs)
    take = lambda flag: refs.pop(0) if flag else None
    x_ref, r_ref = refs.pop(0), take(st.residual)
    vec = {name: refs.pop(0) for name in st.vectors()}
    rw_ref = refs.pop(0)
    shared_refs = [refs.pop(0) for _ in range(3 * st.shared)]  # the shared MLP's gate, up, down
    w_refs = [refs.pop(0) for _ in range(n_w)]
    down_ref, out_ref = refs.pop(0), refs.pop(0)
    total_ref, shared_out_ref = take(st.residual), take(st.shared)
    acc_ref, xin_ref, ids_ref, wts_ref = refs
    s, j = pl.program_id(0), pl.program_id(1)

    @pl.when(jnp.logical_and(s == 0, j == 0))
    def _route():
        # the layer's router block, and the vector stacks whole (a few hundred KB; one row of a packed bf16 stack
        # is no aligned block), their row picked here
        pick = lambda name: _row(vec[name][...], layer_ref[0]) if name in vec else None
        x = x_ref[...]
        if st.x_norm:
            x = rms_forward(x, pick("x_norm"), eps=st.eps)
        rst = RouteStatic(st.top_k, x_ref.shape[0], norm=True, residual=st.residual, eps=st.eps)
        y, total = normed_input(rst, x, None if r_ref is None else r_ref[...], pick("norm"))
        if total_ref is not None:
            total_ref[...] = total
        logits = jax.lax.dot_general(y, rw_ref[...], (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        ids, wts = top_k_softmax(logits, st.top_k, pick("scale"))
        ids_ref[...] = ids
        wts_ref[...] = wts
        xin_ref[...] = y if not st.expert_norm else rms_forward(total, pick("expert_norm"), eps=st.eps)
        if shared_out_ref is not None:  # the shared MLP: every token, weight 1, its own accumulator
            xs = y if not st.shared_norm else rms_forward(total, pick("shared_norm"), eps=st.eps)
            acc_ref[...] = jnp.zeros_like(acc_ref)
            ones = jnp.ones((xs.shape[0], 1), jnp.float32)
            expert_step(xs, ones, shared_refs[:2], shared_refs[2], acc_ref, split=None, activation=st.activation,
                        precision=precision)
            shared_out_ref[...] = acc_ref[...].astype(shared_out_ref.dtype)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    ids = ids_ref[...]
    lanes = jax.lax.broadcasted_iota(jnp.int32, ids.shape, 1)
    hit = jnp.logical_and(ids == first_ref[0] + s, lanes < st.top_k)
    col = jnp.sum(jnp.where(hit, wts_ref[...], 0.0), axis=1, keepdims=True)
    expert_step(xin_ref[...], col, w_refs, down_ref, acc_ref, split=split, activation=st.activation,
                precision=precision)

    @pl.when(jnp.logical_and(s == pl.num_programs(0) - 1, j == nj - 1))
    def _store():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("st",))
def routed_experts(st: RoutedStatic, x: jax.Array, residual: jax.Array | None, vectors: dict[str, jax.Array],
                   router: jax.Array, shared: tuple[jax.Array, jax.Array, jax.Array] | None,
                   w_gate_up: jax.Array | tuple[jax.Array, jax.Array], w_down: jax.Array, layer: jax.Array,
                   first: jax.Array) -> tuple[jax.Array, ...]:
    """(out [Tp, H] in x's dtype, then x + residual when st.residual, then the shared MLP's output when st.shared)
    for x [Tp, H] (Tp a multiple of 16), every weight stacked over layers and read at `layer` (int32 scalar):
    `vectors` (st.vectors(): the router's norm, the experts' and the shared MLP's norms, x's own norm [L, H], the
    per-expert scale [L, E] f32), router [L, H, E]; `shared` (gate [L, H, Is], up [L, H, Is], down [L, Is, H]);
    w_gate_up [L, El, H, 2I] gate-first or a pair of [L, El, H, I], w_down [L, El, I, H]; `first` (int32 scalar)
    the global id of local expert 0."""
    tp, h = x.shape
    e = router.shape[-1]
    el, i = w_down.shape[-3], w_down.shape[-2]
    ti = st.ti
    nj = i // ti
    row = pl.BlockSpec((tp, h), lambda s, j, *_: (0, 0))
    gate_map = lambda s, j, layer_ref, _: (layer_ref[0], s, 0, j)
    up_map = lambda s, j, layer_ref, _: (layer_ref[0], s, 0, j + nj)
    down_map = lambda s, j, layer_ref, _: (layer_ref[0], s, j, 0)
    w_specs, w_args, split = weight_specs(w_gate_up, h, i, ti, (None,), gate_map, up_map)
    # the layer's stacks stay in HBM, read as blocks at the layer: left to XLA, a stack (or a slice of it) may be
    # staged into VMEM whole before every call
    in_hbm = (lambda a: a) if st.interpret else (lambda a: pltpu.with_memory_space_constraint(a, pltpu.HBM))
    layer_args = [in_hbm(vectors[name]) for name in st.vectors()] + [in_hbm(router)]
    layer_args += [in_hbm(a) for a in (shared or ())]
    args = [x, *([residual] if st.residual else []), *layer_args, *w_args, w_down]
    layer_block = lambda a: (pl.BlockSpec(a.shape, lambda s, j, *_: (0, 0)) if a.ndim == 2 else
                             pl.BlockSpec((None, *a.shape[1:]), lambda s, j, layer_ref, _: (layer_ref[0], 0, 0)))
    in_specs = [row, *([row] if st.residual else []), *(layer_block(a) for a in layer_args), *w_specs,
                pl.BlockSpec((None, None, ti, h), down_map)]
    out_shape = [jax.ShapeDtypeStruct((tp, h), x.dtype)] * (1 + st.residual + st.shared)
    itemsize = jnp.dtype(x.dtype).itemsize
    shared_bytes = sum(a[0].size * jnp.dtype(a.dtype).itemsize for a in (shared or ()))
    w_bytes = (3 * el * h * i * jnp.dtype(w_down.dtype).itemsize + h * e * jnp.dtype(router.dtype).itemsize
               + shared_bytes)
    cost = pl.CostEstimate(flops=2 * 3 * tp * h * i * el + 2 * tp * h * e + 2 * tp * shared_bytes // itemsize,
                           transcendentals=tp * i * el + tp * e,
                           bytes_accessed=w_bytes + (2 + 2 * st.residual + st.shared) * tp * h * itemsize)
    kernel = functools.partial(_kernel, st=st, nj=nj, n_w=len(w_specs), split=split,
                               precision=jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None)
    outs = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(el, nj),
            in_specs=in_specs,
            out_specs=[row] * len(out_shape),
            scratch_shapes=[pltpu.VMEM((tp, h), jnp.float32), pltpu.VMEM((tp, h), x.dtype),
                            pltpu.VMEM((tp, LANES), jnp.int32), pltpu.VMEM((tp, LANES), jnp.float32)],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary", "arbitrary"),
                                             vmem_limit_bytes=st.vmem_limit_bytes),
        interpret=st.interpret,
        cost_estimate=cost,
        name="moe_routed_experts",
    )(jnp.reshape(layer, (1,)).astype(jnp.int32), jnp.reshape(first, (1,)).astype(jnp.int32), *args)
    return tuple(outs)
