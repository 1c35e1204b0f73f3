"""transformers' whole expert block as one JAX function: what the torch builds' `experts_forward` runs as one op.

    experts_block(hidden[T,H], top_k_index[T,K], top_k_weights[T,K], gate_up, down[, up_bias, down_bias]) -> [T,H]

Every layout transformers' `use_experts_implementation` describes that experts_forward accepts (see
hf_experts.py): weights nn.Linear-style (`gate_up[E,2I,H]`, `down[E,H,I]`) or transposed (`[E,H,2I]`, `[E,I,H]`), the
gate and up halves stacked or interleaved, an ungated up projection, per-expert biases, and the gates "glu"
(act(gate) * up) and "clamped_swiglu" (GPT-OSS: gate clamped above at `limit`, up to [-limit, limit],
(up + 1) * gate * sigmoid(alpha * gate)). In one function: the routing sort, both ragged dots of this package, the
biases, the gate, the routing weights and the per-token sum, so TorchTPU runs a layer as one op (torch_bridge.py
registers it through torch_tpu's jax_op) and CPU runs the same function through DLPack.

Expert-parallel sentinels: ids outside [0, E) (transformers writes `num_experts` for a token routed to another
rank's experts) sort past every group, so the ragged dots never compute their rows, and their routing weight is
zeroed: they contribute exactly nothing. The matmuls accumulate in float32; the gate runs in float32; the
down projection reads the gated rows in the weights' dtype (as transformers' own implementations do).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from ..api import ragged_dot
from .experts import ACTIVATIONS

#: The gates experts_block computes (hf_experts.py recognises a module's gate as one of these).
GATES = ("glu", "clamped_swiglu", "none")


def gate(h: jax.Array, *, kind: str, concatenated: bool, activation: str, alpha: float, limit: float) -> jax.Array:
    """The block's middle step on the up projection's rows (float32)."""
    if kind == "none":
        return ACTIVATIONS[activation](h)
    i = h.shape[-1] // 2
    g, u = (h[:, :i], h[:, i:]) if concatenated else (h[:, 0::2], h[:, 1::2])
    if kind == "glu":
        return ACTIVATIONS[activation](g) * u
    if kind == "clamped_swiglu":
        g = jnp.minimum(g, limit)
        u = jnp.clip(u, -limit, limit)
        return (u + 1.0) * (g * jax.nn.sigmoid(g * alpha))
    raise ValueError(f"unknown gate {kind!r}; known: {', '.join(GATES)}")


def experts_block(hidden: jax.Array, top_k_index: jax.Array, top_k_weights: jax.Array, gate_up: jax.Array,
                  down: jax.Array, up_bias: jax.Array | None = None, down_bias: jax.Array | None = None, *,
                  is_transposed: bool, gate_kind: str, concatenated: bool, activation: str, alpha: float,
                  limit: float, implementation: Any = None, interpret: Any = None) -> jax.Array:
    """The expert block (module docstring); result in hidden's dtype."""
    e = gate_up.shape[0]
    t, k = top_k_index.shape
    w_up = gate_up if is_transposed else jnp.swapaxes(gate_up, 1, 2)  # [E, H, 2I]
    w_down = down if is_transposed else jnp.swapaxes(down, 1, 2)  # [E, I, H]
    dtype = w_up.dtype
    flat = top_k_index.reshape(-1).astype(jnp.int32)
    key = jnp.where((flat >= 0) & (flat < e), flat, e)  # sentinels: no group, sorted last
    order = jnp.argsort(key, stable=True)
    sorted_key = key[order]
    sizes = jnp.bincount(sorted_key, length=e + 1)[:e].astype(jnp.int32)
    kept = sorted_key < e
    safe = jnp.minimum(sorted_key, e - 1)
    tok = order // k
    run = functools.partial(ragged_dot, preferred_element_type=jnp.float32, implementation=implementation,
                            interpret=interpret)
    h = run(hidden[tok].astype(dtype), w_up, sizes)
    if up_bias is not None:
        h = h + up_bias[safe].astype(jnp.float32)
    a = gate(h, kind=gate_kind, concatenated=concatenated, activation=activation, alpha=alpha, limit=limit)
    out = run(a.astype(dtype), w_down, sizes)
    if down_bias is not None:
        out = out + down_bias[safe].astype(jnp.float32)
    w = jnp.where(kept, top_k_weights.reshape(-1)[order].astype(jnp.float32), 0.0)
    rows = jnp.where(kept[:, None], out * w[:, None], 0.0)
    return jnp.zeros((t, hidden.shape[1]), jnp.float32).at[tok].add(rows).astype(hidden.dtype)


#: experts_block compiled once per shapes and layout (every keyword is static).
_block = jax.jit(experts_block, static_argnames=("is_transposed", "gate_kind", "concatenated", "activation", "alpha",
                                                 "limit", "implementation", "interpret"))


@functools.cache  # one function per option set: the torch bridge caches its backward by it
def experts_function(bias: bool, implementation: Any, interpret: Any) -> Any:
    """experts_block with the contract's options fixed, annotated the way torch_tpu's jax_op reads a schema off:
    tensors positional (the two biases only when `bias`), the layout keyword-only."""
    if bias:
        def experts_forward_bias(hidden: jax.Array, top_k_index: jax.Array, top_k_weights: jax.Array,
                                 gate_up: jax.Array, down: jax.Array, up_bias: jax.Array, down_bias: jax.Array, *,
                                 is_transposed: bool, gate_kind: str, concatenated: bool, activation: str,
                                 alpha: float, limit: float) -> jax.Array:
            return _block(hidden, top_k_index, top_k_weights, gate_up, down, up_bias, down_bias,
                                 is_transposed=is_transposed, gate_kind=gate_kind, concatenated=concatenated,
                                 activation=activation, alpha=alpha, limit=limit, implementation=implementation,
                                 interpret=interpret)

        return experts_forward_bias

    def experts_forward(hidden: jax.Array, top_k_index: jax.Array, top_k_weights: jax.Array, gate_up: jax.Array,
                        down: jax.Array, *, is_transposed: bool, gate_kind: str, concatenated: bool, activation: str,
                        alpha: float, limit: float) -> jax.Array:
        return _block(hidden, top_k_index, top_k_weights, gate_up, down, is_transposed=is_transposed,
                             gate_kind=gate_kind, concatenated=concatenated, activation=activation, alpha=alpha,
                             limit=limit, implementation=implementation, interpret=interpret)

    return experts_forward


#: Positions that get gradients: hidden, routing weights, both weights (and both biases in the bias form).
DIFFERENTIABLE = (0, 2, 3, 4)
DIFFERENTIABLE_BIAS = (0, 2, 3, 4, 5, 6)
