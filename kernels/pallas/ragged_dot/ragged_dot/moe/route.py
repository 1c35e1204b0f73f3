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
from ..pallas.route import RouteStatic, route_forward, top_k_softmax

#: Tokens per grid step of the kernel.
BLOCK_TOKENS = 256


def _xla(x, w, k: int):
    logits = jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    ids, wts = top_k_softmax(logits, k)
    return ids[:, :k], wts[:, :k]


@functools.partial(jax.jit, static_argnames=("impl", "st"))
def _run(x, w_stack, layer, *, impl: str, st: RouteStatic):
    # the layer's slice: the kernel lets XLA fuse it into its weight operand (no op of its own, no staged stack)
    w = jax.lax.dynamic_index_in_dim(w_stack, layer, keepdims=False)
    if impl == "pallas":
        return route_forward(st, x, w)
    return _xla(x, w, st.top_k)


def moe_route(
    x: jax.Array,
    router_weight: jax.Array,
    *,
    top_k: int,
    layer: int | jax.Array | None = None,
    implementation: str | Sequence[str] | None = None,
    interpret: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """The top `top_k` experts of each token and their softmax weights.

    Args:
      x: [T, H] tokens (bf16 or f32); router_weight: [H, E] (or [L, H, E] with `layer`, an integer scalar, traced or
        not, a scan's counter: the layer's slice is fused into the kernel's read, no op of its own); top_k: experts
        per token, 1 <= top_k <= min(E, 128).
      implementation / interpret: the kernel contract ("pallas" the TPU kernel; "cpu" and "xla" the same arithmetic
        in XLA).

    Returns:
      (ids [T, top_k] int32, weights [T, top_k] float32), each row's weights summing to 1; a row whose logits hold a
      NaN gets NaN weights.
    """
    x, router_weight = jnp.asarray(x), jnp.asarray(router_weight)
    if layer is None:
        stack, layer = router_weight[None], jnp.zeros((), jnp.int32)
    else:
        if router_weight.ndim != 3:
            raise ValueError(f"moe_route: with layer=, router_weight must be stacked over layers, [L, H, E]; got "
                             f"{router_weight.shape}")
        stack, layer = router_weight, layer_index(layer, router_weight.shape[0], "moe_route")
    if x.ndim != 2 or stack.ndim != 3 or stack.shape[1] != x.shape[1]:
        raise ValueError(f"moe_route: x must be [T, H] and router_weight [H, E] (or [L, H, E] with layer=), got "
                         f"{x.shape} and {router_weight.shape}")
    e = stack.shape[2]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= min(e, 128):
        raise ValueError(f"moe_route: top_k must be an int in [1, {min(e, 128)}] for {e} experts, got {top_k!r}")
    if x.shape[0] == 0:
        return jnp.zeros((0, top_k), jnp.int32), jnp.zeros((0, top_k), jnp.float32)
    bt = x.shape[0] if x.shape[0] <= BLOCK_TOKENS else BLOCK_TOKENS

    def run(impl: str, mode: Any):
        return _run(x, stack, layer, impl=impl, st=RouteStatic(top_k, bt, mode))

    return run_dispatch(DISPATCH, implementation, interpret, (x, stack), run, "the MoE router kernel")
