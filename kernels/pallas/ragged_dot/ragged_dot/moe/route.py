"""`moe_route`: a Mixture-of-Experts router in one call, the routing `moe_experts` takes.

logits = x @ router_weight in float32, the top k experts per token (ties to the lower expert, as jax.lax.top_k), and
their weights as the softmax over those k logits: what Qwen3-MoE (norm_topk_prob), Mixtral, GPT-OSS and Gemma 4
compute (a softmax over every expert renormalised over the k picked is the same numbers: its normaliser cancels).
Why one call: at decode the router is a [T, H] x [H, E] dot and a few reductions, so on a TPU its cost is the ops
XLA makes of it (the dot, top_k's iota and sort, the softmax's max, sum and divide), not the math.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._vendor.interpret import run_dispatch
from .._vendor.layer_index import layer_index
from ..dispatch import DISPATCH
from ..pallas.route import RouteStatic, normed_input, route_forward, top_k_softmax

#: Tokens per grid step of the kernel.
BLOCK_TOKENS = 256


def _xla(st: RouteStatic, x, w, norm_w, residual, scale):
    y, total = normed_input(st, x, residual, norm_w)
    logits = jax.lax.dot_general(y, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    ids, wts = top_k_softmax(logits, st.top_k, None if scale is None else scale.astype(jnp.float32))
    return (ids[:, :st.top_k], wts[:, :st.top_k]) + ((y,) if st.norm else ()) + ((total,) if st.residual else ())


@functools.partial(jax.jit, static_argnames=("impl", "st"))
def _run(x, w_stack, norm_stack, residual, scale_stack, layer, *, impl: str, st: RouteStatic):
    # each layer's slice: the kernel lets XLA fuse it into its operand (no op of its own, no staged stack)
    row = lambda stack: None if stack is None else jax.lax.dynamic_index_in_dim(stack, layer, keepdims=True)
    w = jax.lax.dynamic_index_in_dim(w_stack, layer, keepdims=False)
    args = (x, w, row(norm_stack), residual, row(scale_stack))
    if impl == "pallas":
        return route_forward(st, *args)
    return _xla(st, *args)


def _stack(name: str, a: jax.Array | None, layer, width: int) -> jax.Array | None:
    """An optional per-layer vector as a stack [L, width] (one layer: a stack of one); ValueError on its shape."""
    if a is None:
        return None
    a = jnp.asarray(a)
    want = (width,) if layer is None else (None, width)
    if a.ndim != len(want) or a.shape[-1] != width:
        raise ValueError(f"moe_route: {name} must be [{width}] (or [L, {width}] with layer=), got {a.shape}")
    return a[None] if layer is None else a


def moe_route(
    x: jax.Array,
    router_weight: jax.Array,
    *,
    top_k: int,
    layer: int | jax.Array | None = None,
    norm_weight: jax.Array | None = None,
    residual: jax.Array | None = None,
    eps: float = 1e-6,
    expert_scale: jax.Array | None = None,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
) -> tuple[jax.Array, ...]:
    """The top `top_k` experts of each token and their softmax weights; optionally with the norm before the router
    in the same call (at decode the norm is an op of its own, its output read by the router and the experts).

    Args:
      x: [T, H] tokens (bf16 or f32); router_weight: [H, E] (or [L, H, E] with `layer`, an integer scalar, traced or
        not, a scan's counter: the layer's slice is fused into the kernel's read, no op of its own); top_k: experts
        per token, 1 <= top_k <= min(E, 128).
      norm_weight: None, or [H] (stacked [L, H] with layer): the router reads RMSNorm(x) with this weight (float32
        arithmetic, rounded to x's dtype, eps `eps`), returned too: the experts' input. residual: None, or (with
        norm_weight) the residual stream, x's shape and dtype, added to x first (rounded to x's dtype, as
        `rms_norm(residual=)` does) and the sum returned. expert_scale: None, or [E] (stacked [L, E]): each
        weight multiplied by its expert's scale after the softmax (Gemma 4's per-expert scale).
      implementation / interpret: the kernel contract ("pallas" the TPU kernel; "cpu" and "xla" the same arithmetic
        in XLA).

    Returns:
      (ids [T, top_k] int32, weights [T, top_k] float32), each row's weights summing to 1 (before expert_scale);
      then the normalised x with norm_weight, then x + residual with residual. A row whose logits hold a NaN gets
      NaN weights.
    """
    x, router_weight = jnp.asarray(x), jnp.asarray(router_weight)
    if layer is None:
        stack, at = router_weight[None], jnp.zeros((), jnp.int32)
    else:
        if router_weight.ndim != 3:
            raise ValueError(f"moe_route: with layer=, router_weight must be stacked over layers, [L, H, E]; got "
                             f"{router_weight.shape}")
        stack, at = router_weight, layer_index(layer, router_weight.shape[0], "moe_route")
    if x.ndim != 2 or stack.ndim != 3 or stack.shape[1] != x.shape[1]:
        raise ValueError(f"moe_route: x must be [T, H] and router_weight [H, E] (or [L, H, E] with layer=), got "
                         f"{x.shape} and {router_weight.shape}")
    e = stack.shape[2]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= min(e, 128):
        raise ValueError(f"moe_route: top_k must be an int in [1, {min(e, 128)}] for {e} experts, got {top_k!r}")
    norm_stack = _stack("norm_weight", norm_weight, layer, x.shape[1])
    scale_stack = _stack("expert_scale", expert_scale, layer, e)
    if residual is not None:
        residual = jnp.asarray(residual)
        if norm_stack is None or residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"moe_route: residual needs norm_weight= and x's shape and dtype {x.shape} {x.dtype}, "
                             f"got {residual.shape} {residual.dtype}"
                             f"{'' if norm_stack is not None else ' without a norm_weight'}")
    if not float(eps) >= 0.0:
        raise ValueError(f"moe_route: eps must be >= 0, got {eps}")
    if x.shape[0] == 0:
        rows = jnp.zeros(x.shape, x.dtype)
        return ((jnp.zeros((0, top_k), jnp.int32), jnp.zeros((0, top_k), jnp.float32))
                + (rows,) * ((norm_stack is not None) + (residual is not None)))
    bt = x.shape[0] if x.shape[0] <= BLOCK_TOKENS else BLOCK_TOKENS

    def run(impl: str, mode: Any):
        st = RouteStatic(top_k, bt, mode, norm=norm_stack is not None, residual=residual is not None,
                         scaled=scale_stack is not None, eps=float(eps))
        return _run(x, stack, norm_stack, residual, scale_stack, at, impl=impl, st=st)

    return run_dispatch(DISPATCH, implementation, interpret, (x, stack), run, "the MoE router kernel")
