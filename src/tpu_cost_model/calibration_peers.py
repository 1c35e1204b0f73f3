"""The calibration's grouped-matmul rows as their measured kernels ran them, built on peer source read at bench time
(peer_source.py): tpu-inference's megablox gmm_v2 at the rows of tpu-inference issue 3520, and Hugging Face's
ragged-dot-tpu experts layer (Tokamax's v2 grouped matmul, `implementation="mosaic_tpu_v2"`) at its card's rows.

Each builder returns (fn, args) for kernel_cost: the kernel's weights and activations abstract, the routing concrete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .workload import topk_routing

if TYPE_CHECKING:
    from types import ModuleType

    from kernel_hub.json_types import JsonDict


def issue_group_sizes(groups: int, touched: int, rows: int, m: int) -> np.ndarray:
    """Issue 3520's routing: `touched` groups of `rows` rows each, zeros elsewhere, the padding of M (a multiple of
    16) given to the last touched group."""
    if not 0 < touched <= groups or touched * rows > m:
        raise ValueError(f"{touched} groups of {rows} rows do not fit {groups} groups and M = {m}")
    sizes = np.zeros(groups, np.int32)
    sizes[:touched] = rows
    sizes[touched - 1] += m - touched * rows
    return sizes


def gmm_v2_row(row: JsonDict, gmm: ModuleType) -> tuple[Any, tuple[Any, ...]]:
    """tpu-inference's gmm_v2 at the row's shapes with its own tiling (calculate_tiling, as the issue ran it):
    bf16 lhs, weights in the row's dtype with no scale (the issue gives weight bytes only)."""
    import jax

    s, dt = row["shapes"], row["dtypes"]
    m, k = s["lhs"]
    groups = s["rhs"][0]
    if k != s["rhs"][1]:
        raise ValueError(f"lhs {s['lhs']} does not contract with rhs {s['rhs']}")
    sizes = issue_group_sizes(groups, s["touched_groups"], s["rows_per_group"], m)
    sds = jax.ShapeDtypeStruct
    args = (sds((m, k), dt["lhs"]), sds(tuple(s["rhs"]), dt["rhs"]), sizes)
    return (lambda lhs, rhs, group_sizes: gmm.gmm_v2(lhs, rhs, group_sizes)), args


def rank_routing(tokens: int, experts: int, top_k: int, local: int, seed: int = 0) -> np.ndarray:
    """Expert ids [tokens, top_k] as one expert-parallel rank sees them: a uniform top-k routing over all experts,
    the rank holding experts 0..local-1, every pick of another rank's expert given the sentinel id `local`."""
    ids = topk_routing(tokens, experts, top_k, seed)
    return np.where(ids < local, ids, local).astype(np.int32)


def hf_experts_row(row: JsonDict, gmm: ModuleType) -> tuple[Any, tuple[Any, ...]]:
    """Hugging Face's ragged-dot-tpu experts layer on one EP rank at the row's shapes: the picks sorted by expert,
    each local expert's row count, the picked tokens' rows gathered, gate_up by Tokamax's v2 grouped matmul on
    weights stored [E, 2I, H] (contracted on their last axis: the kernel's transpose_rhs path, as Tokamax's
    mosaic_tpu_v2 op calls it for these dimension numbers), SiLU(gate) x up with the activation in f32, down
    likewise, other ranks' picks zeroed, the routing weights applied, un-sorted and summed over the top-k in f32."""
    import jax
    import jax.numpy as jnp

    s, dt = row["shapes"], row["dtypes"]
    tokens, hidden, inter, top_k, local = s["tokens"], s["hidden"], s["intermediate"], s["top_k"], s["local_experts"]
    ids = rank_routing(tokens, s["experts"], top_k, local)

    def grouped(lhs: jax.Array, rhs: jax.Array, sizes: jax.Array) -> jax.Array:
        return gmm.gmm_v2(lhs, rhs, sizes, None, None, None, preferred_element_type=lhs.dtype,
                          maybe_quantize_lhs=False, zero_initialize=True, transpose_rhs=True)

    def layer(x: jax.Array, expert_ids: jax.Array, weights: jax.Array, w_gate_up: jax.Array,
              w_down: jax.Array) -> jax.Array:
        picks = expert_ids.reshape(-1)
        order = jnp.argsort(picks)
        by_expert = picks[order]
        sizes = jnp.sum(by_expert[:, None] == jnp.arange(local)[None, :], axis=0, dtype=jnp.int32)
        h = grouped(x[order // top_k], w_gate_up, sizes)
        gate, up = h[:, :inter], h[:, inter:]
        act = jax.nn.silu(gate.astype(jnp.float32)).astype(gate.dtype) * up
        y = grouped(act, w_down, sizes)
        y = jnp.where((by_expert < local)[:, None], y, 0) * weights.reshape(-1)[order][:, None]
        y = y[jnp.argsort(order)].astype(jnp.float32)
        return y.reshape(tokens, top_k, hidden).sum(axis=1).astype(x.dtype)

    sds = jax.ShapeDtypeStruct
    args = (sds((tokens, hidden), dt["x"]), ids, sds((tokens, top_k), dt["x"]),
            sds((local, 2 * inter, hidden), dt["weights"]), sds((local, hidden, inter), dt["weights"]))
    return layer, args
