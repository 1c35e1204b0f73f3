"""Pallas TPU (Mosaic) kernel: a decode-size expert block with every token through each routed expert of a device.

    dense_experts(x [T,H], gate_w [T,El] f32, order [El] i32, count [1] i32, w_gate_up, w_down) -> [T,H]

gate_w[t, e] is the routing weight token t gives local expert e (0 where it did not pick e); order lists the local
experts that have tokens first (count of them). Grid (El, I tiles): step (s, j) runs expert order[s] on I columns j:
h_g = x @ Wg[:, j], h_u = x @ Wu[:, j] (f32), a = act(h_g) * h_u * gate_w[:, e], acc += a @ Wd[j, :] (f32), and
writes acc in x's dtype after the last step. Steps past `count` point their weight blocks at the last active
step's (the pipeline fetches nothing new) and compute nothing, so an expert nobody picked costs no weight read.

Why: at decode a device's experts see a few rows each. Sorting rows by expert, gathering them, two ragged dots and a
scatter back are a dozen small XLA ops a layer around two kernels; here there is one kernel and one tiny op
(gate_w). Running all T tokens through an expert costs the MXU no more than its few rows while T is at most the
MXU's width: each weight tile is pushed through the array once either way (moe/formulation.py chooses by that).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def expert_step(x: jax.Array, col: jax.Array, w_refs: list, down_ref, acc_ref, *, split: int | None,
                activation: Callable, precision: jax.lax.Precision | None) -> None:
    """acc += (act(x @ Wg) * (x @ Wu) * col) @ Wd on one expert's I tile: the arithmetic every dense-experts grid
    step runs (x [Tp, H] in its dtype, col [Tp, 1] f32 the token weights of the step's expert)."""
    mxu = functools.partial(jax.lax.dot_general, dimension_numbers=(((1,), (0,)), ((), ())),
                            precision=precision, preferred_element_type=jnp.float32)
    dot = lambda a, w: mxu(a, w.astype(a.dtype))  # weights of another dtype than x (f32 x, bf16 weights) widened
    if split is None:
        gate, up = dot(x, w_refs[0][...]), dot(x, w_refs[1][...])
    else:  # one block holds the expert's gate and up columns side by side
        gate, up = dot(x, w_refs[0][:, :split]), dot(x, w_refs[0][:, split:])
    a = (activation(gate) * up * col).astype(x.dtype)
    acc_ref[...] += dot(a, down_ref[...])


def weight_specs(w_gate_up, h: int, i: int, ti: int, lead: tuple, gate_map, up_map
                 ) -> tuple[list, list, int | None]:
    """(BlockSpecs, operands, split) of the gate and up weights: a (gate, up) pair as two operands, a gate-first
    array as two views of one operand (tiled I), or whole [H, 2I] blocks sliced in the kernel at `split` (I not a
    lane multiple)."""
    if isinstance(w_gate_up, tuple):
        return [pl.BlockSpec((*lead, None, h, ti), gate_map)] * 2, list(w_gate_up), None
    if ti < i or i % 128 == 0:
        specs = [pl.BlockSpec((*lead, None, h, ti), gate_map), pl.BlockSpec((*lead, None, h, ti), up_map)]
        return specs, [w_gate_up, w_gate_up], None
    return [pl.BlockSpec((*lead, None, h, 2 * i), gate_map)], [w_gate_up], i


def _dense_experts_kernel(order_ref, count_ref, *refs, nj: int, split: int | None, activation: Callable,
                          stacked: bool, precision: jax.lax.Precision | None) -> None:
    del order_ref
    if stacked:
        refs = refs[1:]  # the layer's ref: only the index maps read it
    x_ref, gw_ref, *w_refs, down_ref, out_ref, acc_ref = refs
    s, j = pl.program_id(0), pl.program_id(1)

    @pl.when(jnp.logical_and(s == 0, j == 0))
    def _zero():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(s < count_ref[0])
    def _run():
        gw = gw_ref[...]  # column s: the weights of expert order[s]
        lanes = jax.lax.broadcasted_iota(jnp.int32, gw.shape, 1)
        col = jnp.sum(jnp.where(lanes == s, gw, 0.0), axis=1, keepdims=True)
        expert_step(x_ref[...], col, w_refs, down_ref, acc_ref, split=split, activation=activation,
                    precision=precision)

    @pl.when(jnp.logical_and(s == pl.num_programs(0) - 1, j == nj - 1))
    def _store():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("activation", "ti", "vmem_limit_bytes", "interpret"))
def dense_experts(
    x: jax.Array,
    gate_w: jax.Array,
    order: jax.Array,
    count: jax.Array,
    w_gate_up: jax.Array | tuple[jax.Array, jax.Array],
    w_down: jax.Array,
    *,
    activation: Callable[[jax.Array], jax.Array],
    ti: int,
    vmem_limit_bytes: int | None = None,
    interpret: object = False,
    layer: jax.Array | None = None,
) -> jax.Array:
    """x [Tp, H] (Tp a multiple of 16), gate_w [Tp, El] f32 with its columns in `order`'s order (column s
    belongs to expert order[s]), order [El] int32, count [1] int32; w_gate_up [El, H, 2I] gate-first or a (w_gate,
    w_up) pair of [El, H, I]; w_down [El, I, H]; with `layer` (an int32 scalar) every weight is stacked [L, ...] and
    layer `layer` is read in place. `ti`: the I tile (moe/formulation.column_tiles); a gate-first array with
    ti < I needs I % 128 == 0. Returns [Tp, H] in x's dtype."""
    tp, h = x.shape
    stacked = layer is not None
    el = gate_w.shape[1]
    i = w_down.shape[-2]
    nj = i // ti
    lead = (None,) if stacked else ()

    def expert(s, j, order_ref, count_ref, *layer_ref):
        last = jnp.maximum(count_ref[0] - 1, 0)
        live = s < count_ref[0]
        e = order_ref[jnp.minimum(s, last)]
        jj = jnp.where(live, j, nj - 1)  # past the active experts: the last active step's blocks, nothing fetched
        return (layer_ref[0][0],) if stacked else (), e, jj

    def gate_map(s, j, *refs):
        at, e, jj = expert(s, j, *refs)
        return (*at, e, 0, jj)

    def up_map(s, j, *refs):
        at, e, jj = expert(s, j, *refs)
        return (*at, e, 0, jj + nj)

    def down_map(s, j, *refs):
        at, e, jj = expert(s, j, *refs)
        return (*at, e, jj, 0)

    whole = lambda s, j, *refs: (0, 0)
    w_specs, w_args, split = weight_specs(w_gate_up, h, i, ti, lead, gate_map, up_map)
    prefetch = [order.astype(jnp.int32), count.astype(jnp.int32)]
    if stacked:
        prefetch.append(jnp.reshape(layer, (1,)).astype(jnp.int32))
    itemsize = jnp.dtype(x.dtype).itemsize
    kernel = functools.partial(_dense_experts_kernel, nj=nj, split=split, activation=activation, stacked=stacked,
                               precision=jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None)
    cost = pl.CostEstimate(flops=2 * 3 * tp * h * i * el, transcendentals=tp * i * el,
                           bytes_accessed=3 * el * h * i * jnp.dtype(w_down.dtype).itemsize + 2 * tp * h * itemsize)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((tp, h), x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch),
            grid=(el, nj),
            in_specs=[pl.BlockSpec((tp, h), whole), pl.BlockSpec((tp, el), whole), *w_specs,
                      pl.BlockSpec((*lead, None, ti, h), down_map)],
            out_specs=pl.BlockSpec((tp, h), whole),
            scratch_shapes=[pltpu.VMEM((tp, h), jnp.float32)],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary", "arbitrary"),
                                             vmem_limit_bytes=vmem_limit_bytes),
        interpret=interpret,
        cost_estimate=cost,
    )(*prefetch, x, gate_w, *w_args, w_down)
