"""Public entry points: `rms_norm` and `qk_norm_rope`, several implementations behind each (the kernel contract,
docs/kernel-contract.md), chosen by the platform the operands live on.

Implementations: "pallas" (the TPU kernels; compiled on a TPU, interpreted elsewhere unless interpret=False), "xla"
(the same arithmetic as whole-array XLA with the same hand-written backward: the CPU/GPU path) and "autodiff" (the
forward in XLA, its backward derived by jax: an independent check of the hand-written one). All three are
differentiable in x and weight. `qk_norm_rope` has no hand-written backward: its "xla" and "autodiff" are the same,
and every implementation's gradient is jax's of the XLA arithmetic.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from . import formula, rope
from ._vendor.dispatch import Dispatch
from ._vendor.interpret import pallas_remark, run_dispatch
from ._vendor.layer_index import layer_index
from .config import RMSNormConfig, block_rows
from .operands import check_operands, check_qk_rope_operands
from .pallas_qk_rope import QKRopeStatic, qk_rope_forward
from .pallas_rms import RMSStatic, rms_add_forward, rms_backward, rms_forward, rms_forward_stacked
from .xla_gradient import with_xla_gradient

IMPLEMENTATIONS: tuple[str, ...] = ("pallas", "xla", "autodiff")

#: Implementations tried, in order, per platform when none is named.
ORDER: dict[str, tuple[str, ...]] = {"tpu": ("pallas", "xla"), "cpu": ("xla", "autodiff"), "cuda": ("xla",),
                                     "gpu": ("xla",)}

_DISPATCH = Dispatch("rms_norm", IMPLEMENTATIONS, ORDER, ("xla",), remark=pallas_remark)
implementations_for, resolve_implementation, last_implementation = _DISPATCH.exports()


def _fwd_impl(impl: str, st: RMSStatic, x2, w):
    if impl == "pallas":
        return rms_forward(st, x2, w)
    return formula.forward(x2, w, eps=st.eps, zero_centered=st.zero_centered, scale_after_cast=st.scale_after_cast)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _rms(impl: str, st: RMSStatic, x2, w):
    return _fwd_impl(impl, st, x2, w)


def _rms_fwd(impl, st, x2, w):
    return _fwd_impl(impl, st, x2, w), (x2, w)


def _rms_bwd(impl, st, residuals, dy):
    x2, w = residuals
    if impl == "pallas":
        dx, dw = rms_backward(st, x2, w, dy)
    else:
        dx, contrib = formula.backward(x2, w, dy, eps=st.eps, zero_centered=st.zero_centered)
        dw = jnp.sum(contrib, axis=0)
    return dx.astype(x2.dtype), dw.astype(w.dtype)


_rms.defvjp(_rms_fwd, _rms_bwd)


def _row(w_stack, layer):
    return jax.lax.dynamic_index_in_dim(w_stack, layer, keepdims=False)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _rms_stacked(impl: str, st: RMSStatic, x2, w_stack, layer):
    if impl == "pallas":
        return rms_forward_stacked(st, x2, w_stack, layer)
    return _fwd_impl(impl, st, x2, _row(w_stack, layer))


def _rms_stacked_fwd(impl, st, x2, w_stack, layer):
    return _rms_stacked(impl, st, x2, w_stack, layer), (x2, w_stack, layer)


def _rms_stacked_bwd(impl, st, residuals, dy):
    """The one-layer backward on the layer's row; the stack's gradient is that row's, zeros elsewhere."""
    x2, w_stack, layer = residuals
    dx, dw = _rms_bwd(impl, st, (x2, _row(w_stack, layer)), dy)
    d_stack = jax.lax.dynamic_update_index_in_dim(jnp.zeros_like(w_stack), dw, layer, 0)
    return dx, d_stack, None


_rms_stacked.defvjp(_rms_stacked_fwd, _rms_stacked_bwd)


def _add_xla(st: RMSStatic, layer, x2, r2, w_stack, wx_stack=None):
    """The fused add's arithmetic on whole arrays: (norm of s, s) with s = x + residual in x's dtype, x first
    normalised by wx_stack's row when given."""
    if wx_stack is not None:
        x2 = _fwd_impl("xla", st, x2, _row(wx_stack, layer))
    total = (x2.astype(jnp.float32) + r2.astype(jnp.float32)).astype(x2.dtype)
    return _fwd_impl("xla", st, total, _row(w_stack, layer)), total


_rms_add = with_xla_gradient(lambda st, layer, x2, r2, w, wx: tuple(rms_add_forward(st, x2, r2, w, layer, wx)),
                             _add_xla)


@functools.partial(jax.jit, static_argnames=("impl", "eps", "zero_centered", "scale_after_cast", "config",
                                             "interpret"))
def _run_add(x, residual, w_stack, wx_stack, layer, *, impl, eps, zero_centered, scale_after_cast, config,
             interpret):
    h = x.shape[-1]
    st = RMSStatic(eps=eps, zero_centered=zero_centered, scale_after_cast=scale_after_cast,
                   block_rows=block_rows(x.reshape(-1, h).shape[0], h, config), interpret=interpret)
    impl = "xla" if impl == "autodiff" else impl
    y, total = _rms_add(impl, st, layer, x.reshape(-1, h), residual.reshape(-1, h), w_stack, wx_stack)
    return y.reshape(x.shape), total.reshape(x.shape)


@functools.partial(jax.jit, static_argnames=("impl", "eps", "zero_centered", "scale_after_cast", "config",
                                             "interpret"))
def _run(x, w, layer, *, impl, eps, zero_centered, scale_after_cast, config, interpret):
    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    if impl == "autodiff":
        row = w if layer is None else _row(w, layer)
        out = formula.forward(x2, row, eps=eps, zero_centered=zero_centered, scale_after_cast=scale_after_cast)
        return out.reshape(x.shape)
    st = RMSStatic(eps=eps, zero_centered=zero_centered, scale_after_cast=scale_after_cast,
                   block_rows=block_rows(x2.shape[0], h, config), interpret=interpret)
    if layer is not None:
        return _rms_stacked(impl, st, x2, w, layer).reshape(x.shape)
    return _rms(impl, st, x2, w).reshape(x.shape)


def rms_norm(
    x: jax.Array,
    weight: jax.Array,
    *,
    eps: float,
    zero_centered: bool = False,
    scale_after_cast: bool = False,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
    config: RMSNormConfig | None = None,
    layer: int | jax.Array | None = None,
    residual: jax.Array | None = None,
    x_weight: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """RMSNorm of x[..., H] over its last axis with weight[H] -> x's shape and dtype, computed in float32.

    residual: None, or the residual stream (x's shape and dtype): the call adds x to it first and returns
    (RMSNorm(x + residual), x + residual), the sum rounded to x's dtype as a model's residual stream is (vLLM's
    fused_add_rms_norm). One pass over the rows instead of an add and a norm: at decode the add is an op of its own.

    x_weight: None, or (with residual) the weight of an RMSNorm applied to x before the add, weight's shape (and
    stacked the same way with layer=): (RMSNorm(RMSNorm_xw(x) + residual), RMSNorm_xw(x) + residual), a sandwich
    norm's post-norm, the add and the next norm in one pass (Gemma's post-attention norm before its
    pre-feedforward norm), the post-norm's output rounded to x's dtype as a separate norm's is.

    layer: None, or an integer scalar (an int, or an int32 0-d array, possibly traced: a scan's counter) with weight
    stacked over layers, [L, H]: the call reads row `layer` inside the kernel, so a model scanning its layers takes
    no slice of its norm weights (each slice is an op of its own on a TPU). A concrete layer outside [0, L) is
    refused, a traced one clamped; the stack's gradient is that row's, zeros elsewhere.

    zero_centered: scale by (1 + weight) instead of weight (Gemma 1-3's stored form). scale_after_cast: cast the
    normalised x to x's dtype before multiplying by the weight (Llama's order), instead of casting the float32
    product once (Gemma's). Differentiable in x and weight (weight's gradient in weight's dtype).

    implementation / interpret: the kernel contract: a name or a sequence tried in order; interpret None compiles
    on a TPU and interprets elsewhere, False always lowers to Mosaic, a pltpu.InterpretParams with detect_races
    raises RaceDetectedError on a race.
    """
    x, weight = jnp.asarray(x), jnp.asarray(weight)
    if layer is not None:
        if weight.ndim != 2:
            raise ValueError(f"rms_norm: with layer=, weight must be stacked over layers, [L, {x.shape[-1]}]; got "
                             f"{weight.shape} (pass layer=None for one layer's [{x.shape[-1]}] weight)")
        layer = layer_index(layer, weight.shape[0], "rms_norm")
    eps = check_operands(x.shape, weight.shape[-1:] if layer is not None else weight.shape, eps)
    cfg = config or RMSNormConfig()
    if x_weight is not None:
        x_weight = jnp.asarray(x_weight)
        if residual is None or x_weight.shape != weight.shape:
            raise ValueError(f"rms_norm: x_weight needs residual= and weight's shape {weight.shape}, got "
                             f"{x_weight.shape}{'' if residual is not None else ' without a residual'}")
    if residual is not None:
        residual = jnp.asarray(residual)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"rms_norm: residual must have x's shape and dtype {x.shape} {x.dtype}, got "
                             f"{residual.shape} {residual.dtype}")
        stack, at = (weight, layer) if layer is not None else (weight[None], jnp.zeros((), jnp.int32))
        wx = None if x_weight is None else (x_weight if layer is not None else x_weight[None])
        if x.size == 0:
            return jnp.zeros(x.shape, x.dtype), jnp.zeros(x.shape, x.dtype)
        run_add = lambda impl, mode: _run_add(x, residual, stack, wx, at, impl=impl, eps=eps,
                                              zero_centered=bool(zero_centered),
                                              scale_after_cast=bool(scale_after_cast), config=cfg, interpret=mode)
        return run_dispatch(_DISPATCH, implementation, interpret, (x, weight), run_add, "the RMSNorm kernel")
    if x.size == 0:
        return jnp.zeros(x.shape, x.dtype)
    run = lambda impl, mode: _run(x, weight, layer, impl=impl, eps=eps, zero_centered=bool(zero_centered),
                                  scale_after_cast=bool(scale_after_cast), config=cfg, interpret=mode)
    return run_dispatch(_DISPATCH, implementation, interpret, (x, weight), run, "the RMSNorm kernel")


# ------------------------------------------------------------------------------------ q/k norm + rotary, fused


def _qk_rope_xla(st: QKRopeStatic, layer, qkv, q_weight, k_weight, cos, sin):
    """The same arithmetic as the kernel on whole arrays (rope.py), out in qkv's dtype; the weights are rows
    `layer` of their stacks."""
    t, d, nq, nkv = qkv.shape[0], st.head_dim, st.q_heads, st.kv_heads
    x = qkv.reshape(t, -1, d)
    c, s = cos[:, None, :].astype(jnp.float32), sin[:, None, :].astype(jnp.float32)
    q = rope.norm_rope_head(x[:, :nq], _row(q_weight, layer), c, s, eps=st.eps, half=st.half)
    raw = x[:, nq:nq + nkv]
    k = rope.norm_rope_head(raw, _row(k_weight, layer), c, s, eps=st.eps, half=st.half)
    src = raw if st.keys_are_values else x[:, nq + nkv:]
    v = rope.unit_norm(src, st.eps) if st.values == "normed" else src
    return q.astype(qkv.dtype), k.astype(qkv.dtype), v.astype(qkv.dtype)


_qk_rope = with_xla_gradient(lambda st, layer, *args: qk_rope_forward(st, *args, layer), _qk_rope_xla)


@functools.partial(jax.jit, static_argnames=("impl", "st"))
def _run_qk_rope(qkv, q_weight, k_weight, cos, sin, layer, *, impl, st):
    if impl == "pallas" and st.head_dim % 128:
        raise NotImplementedError(f"qk_norm_rope's Pallas kernel slices heads on the lanes: head_dim must be a "
                                  f"multiple of 128, got {st.head_dim}")
    return _qk_rope(impl, st, layer, qkv, q_weight, k_weight, cos, sin)


def qk_norm_rope(
    qkv: jax.Array,
    q_weight: jax.Array,
    k_weight: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    *,
    q_heads: int,
    kv_heads: int,
    eps: float,
    values: str = "raw",
    keys_are_values: bool = False,
    rotary_dims: int | None = None,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
    config: RMSNormConfig | None = None,
    layer: int | jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The attention front of a q/k-normed model in one call: q and k heads RMS-normalised over head_dim, scaled by
    q_weight / k_weight and rotated; v passed through or normalised. Why one op: at decode the three are a few
    hundred kilobytes, so what they cost on a TPU is the ops that move them (a norm call per kind, the rotary's
    slices and the relayouts from the projection's [T, heads x D] to the attention's [T, heads, D]), not the math.

    Args:
      qkv: [T, (q_heads + kv_heads + kv_heads) x D] (or q_heads + kv_heads with keys_are_values): one fused
        projection's output, query heads first, then key heads, then value heads, each head D wide.
      q_weight, k_weight: [D], the q and k norms' weights (y = w * x_normed).
      cos, sin: [T, D] float32 full-width rotary tables (`rope_tables(positions, D, theta, rotary_dims)`).
      q_heads, kv_heads: heads in qkv (D = its width / total heads); eps: the norms' epsilon.
      values: "raw" (v as projected) or "normed" (unit-weight RMSNorm: Gemma 4's scale-free v norm).
      keys_are_values: no value heads in qkv; v is built from the raw key heads (Gemma 4's global layers).
      rotary_dims: dims rotated at the front of each head (even, at most D; default D); must match the tables'.
      implementation / interpret: the kernel contract (as `rms_norm`); config: RMSNormConfig rows per grid step.
      layer: None, or an integer scalar (possibly traced) with q_weight and k_weight stacked over layers, [L, D]:
        the weights of layer `layer`, read inside the kernel (as `rms_norm(layer=)`).

    Returns:
      (q [T, q_heads, D], k [T, kv_heads, D], v [T, kv_heads, D]) in qkv's dtype, computed in float32.
      Differentiable: every implementation's gradient is the XLA arithmetic's.
    """
    qkv, q_weight, k_weight = jnp.asarray(qkv), jnp.asarray(q_weight), jnp.asarray(k_weight)
    cos, sin = jnp.asarray(cos), jnp.asarray(sin)
    if layer is None:  # one layer's weights: a stack of one, read at 0
        q_weight, k_weight, layer = q_weight[None], k_weight[None], jnp.zeros((), jnp.int32)
    else:
        if q_weight.ndim != 2 or k_weight.shape != q_weight.shape:
            raise ValueError(f"qk_norm_rope: with layer=, q_weight and k_weight must both be stacked over layers, "
                             f"[L, head_dim]; got {q_weight.shape} and {k_weight.shape}")
        layer = layer_index(layer, q_weight.shape[0], "qk_norm_rope")
    st = check_qk_rope_operands(qkv.shape, q_weight.shape[1:], k_weight.shape[1:], cos.shape, sin.shape,
                                q_heads=q_heads,
                                kv_heads=kv_heads, eps=eps, values=values, keys_are_values=keys_are_values,
                                rotary_dims=rotary_dims)
    d = st["head_dim"]
    if qkv.shape[0] == 0:
        return tuple(jnp.zeros((0, n, d), qkv.dtype) for n in (q_heads, kv_heads, kv_heads))
    cfg = config or RMSNormConfig()

    def run(impl: str, mode: Any):
        static = QKRopeStatic(block_rows=block_rows(qkv.shape[0], qkv.shape[1], cfg), interpret=mode, **st)
        return _run_qk_rope(qkv, q_weight, k_weight, cos, sin, layer, impl="xla" if impl == "autodiff" else impl,
                            st=static)

    return run_dispatch(_DISPATCH, implementation, interpret, (qkv, q_weight), run, "the q/k norm + rotary kernel")
