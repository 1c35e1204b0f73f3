"""The decode step with vLLM TPU's kernels in place of kernel-hub's: tpu-inference's ragged paged attention v3 (its
fused K/V cache layout, decode-only distribution) and its megablox gmm for the two expert projections, each walked by
the cost model at the step's per-device shapes and routing, swapped for our attention and ragged-dot kernels in the
hub step's cost; everything else (the XLA ops around them, the collectives) as the hub step has it. Not compiled
whole: the peers' kernels do not take the step's cache layout. Runs in the TPU environment.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .decode_models import PAGE, DecodeModel, kv_heads_per_device
from .rates import rates
from .schedule import ScheduleCost, kernel_cost
from .tpu_inference_peers import as_chip, import_kernel
from .workload import topk_routing

if TYPE_CHECKING:
    from kernel_hub.tpu.chips import Chip

#: Our kernels' names in a walk (schedule_grid's CallCost.name): the ones the swap replaces.
OURS = ("ragged_paged_attention", "_gmm_kernel")


def peer_group_costs(m: DecodeModel, batch: int, cache: int, n: int, generation: str) -> list[ScheduleCost]:
    """One layer group's attention and expert projections on vLLM's kernels, device 0, a cost per kernel call."""
    import jax
    import jax.numpy as jnp

    rpa, mb = import_kernel("rpa_v3"), import_kernel("megablox_gmm")
    sds, dt = jax.ShapeDtypeStruct, jnp.bfloat16
    pps = math.ceil(cache / PAGE)
    kv = np.full((batch,), cache, np.int32)
    table = np.arange(batch * pps, dtype=np.int32)
    cu = np.arange(batch + 1, dtype=np.int32)
    dist = np.array([batch, batch, batch], np.int32)
    el = m.experts // n
    out = []
    for p, kind in enumerate(m.pattern):
        hq, kvl, d = m.q_heads // n, kv_heads_per_device(kind.kv_heads, n), kind.head_dim
        shape = rpa.get_kv_cache_shape(batch * pps, PAGE, kvl, d, jnp.dtype(dt))
        scale = m.attention_scale if m.attention_scale is not None else 1.0 / math.sqrt(d)

        def attn(q, k, v, c, lens, pi, cu_, dist_, window=kind.window, scale=scale):
            with as_chip(rpa, generation):
                return rpa.ragged_paged_attention(q, k, v, c, lens, pi, cu_, dist_, sm_scale=scale,
                                                  sliding_window=window, vmem_limit_bytes=64 << 20)

        out.append(kernel_cost(attn, sds((batch, hq, d), dt), sds((batch, kvl, d), dt), sds((batch, kvl, d), dt),
                               sds(shape, dt), kv, table, cu, dist, generation=generation))
        ids = topk_routing(batch, m.experts, m.top_k, seed=p).ravel()
        sizes = np.bincount(ids[ids < el], minlength=el).astype(np.int32)
        rows = max(128, -(-int(sizes.sum()) // 128) * 128)
        h, i = m.hidden, m.moe_intermediate
        for k_, n_ in ((h, 2 * i), (i, h)):  # its tiling: 128 rows, the whole K and N where they divide by 128
            tiling = (128, k_ if k_ % 128 == 0 else 128, n_ if n_ % 128 == 0 else 128)
            out.append(kernel_cost(lambda x, w, g, t=tiling: mb.gmm(x, w, g, preferred_element_type=dt, tiling=t),
                                   sds((rows, k_), dt), sds((el, k_, n_), dt), sizes, generation=generation))
    return out


def ours_in(cost: ScheduleCost, c: Chip, level: str | None = None) -> float:
    """Seconds of our attention and ragged-dot kernel calls in a walk."""
    r = rates(c.generation, level) if level else rates(c.generation)
    return sum(k.seconds(c, r) for k in cost.calls if any(k.name.startswith(o) for o in OURS))


def peers_seconds(costs: list[ScheduleCost], c: Chip, level: str | None = None) -> float:
    r = rates(c.generation, level) if level else rates(c.generation)
    return sum(x.seconds(c, r) for x in costs)
