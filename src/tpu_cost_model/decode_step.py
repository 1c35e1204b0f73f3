"""One decode step of a seed model (decode_models.py) in JAX on kernel-hub's kernels, sharded over one mesh axis of
n devices: attention tensor-parallel (query heads split, KV heads split or replicated when fewer than n), the
experts expert-parallel over the same axis (`moe_experts(mesh=, expert_axis=)`), the vocabulary split for the
embedding and the LM head. Layers run as a `lax.scan` over groups of the model's layer pattern (Qwen3: one layer;
Gemma 4: five sliding + one global), so the compiler sees one group however deep the model is. The experts' weights
and the KV caches are never sliced per layer: they stay whole stacks over the groups (the weights closed over, the
caches in the scan's carry) and the kernels take the scan's counter as `layer=`, reading (and for the caches writing)
that group's layer in place; only the small dense weights are the scan's xs.

`Kernels` names the five ops the step calls and two optional fused ones (the attention's front: the residual add, the
input norm, the q/k/v projection and qk_norm_rope in one call, its projection then a whole stack too; the router with
the norm before it), and whether the attention call takes the output projection (out_proj=, a whole stack too);
`hub_kernels(rms, fa, rd, ...)` takes them from the loaded kernel packages (the rms_norm, flash_attention and ragged_dot
modules, imported by kernel-hub's verified loader), with an `implementation=` for all of them (None: each kernel's order
for the platform; "xla": JAX's own ops, the jax_default path). The attention's projections are one fused weight (`wqkv`,
each device's query, key and value columns side by side, as servers store them): apart, one dot whose output
`qk_norm_rope` turns into the attention's q, k and v in one call; fused, `attention_front` runs the norm, that dot and
qk_norm_rope as one kernel.
`transformers_kernels` is the default path's math: q/k norms and the rotary embedding in XLA, attention over the
cache with K/V repeated to every query head (transformers' repeat_kv), experts by the ragged dot's XLA path.

`decode_step(params, caches, tokens, kv_lens, page_indices, *, model, kernels, mesh)` -> (next tokens [B] by greedy
argmax, caches). kv_lens include the new token (its position is kv_lens - 1); page_indices [B, pages per sequence].
With `routing` (one (ids, weights) pair per layer of a group), the experts take that routing instead of the
router's (the cost model walks the ragged dot with a concrete routing; the router is still computed).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .decode_models import PAGE, AttentionKind, DecodeModel, kv_heads_per_device

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh

AXIS = "x"
#: A layer's weights the step passes to moe_experts as whole stacks over the groups (layer=), never sliced.
EXPERT_WEIGHTS = ("w_gate_up", "w_down")
#: The norms' and the router's weights, passed to their kernels (rms_norm, qk_norm_rope, moe_route) as whole stacks
#: [G, ...] with layer=: each slice taken outside a kernel would be an op of its own on a TPU, a few a layer.
NORM_STACKS = ("attn_norm", "ff_norm", "q_norm", "k_norm", "attn_post_norm", "ff_post_norm", "moe_pre_norm",
               "moe_post_norm", "shared_post_norm", "router")
#: The attention's projection, passed whole too where the step's kernels fuse it into the attention front.
FRONT_STACKS = ("wqkv",)
#: Gemma's router scales, passed whole too where the router runs its own norm and per-expert scale in its call.
ROUTE_STACKS = ("router_scale", "expert_scale")
#: The attention's output projection, passed whole too where the attention kernel multiplies by it (out_proj=).
OUT_STACKS = ("wo",)
#: The shared MLP's weights, passed whole too where the experts' call runs it (route_moe's shared=).
SHARED_STACKS = ("ws_gate", "ws_up", "ws_down")


def whole_stacks(kern: Kernels) -> tuple[str, ...]:
    """The layer weights the step hands its kernels as whole stacks [G, ...] with layer=, the rest being the
    layer scan's xs (sliced per group by the scan)."""
    return (NORM_STACKS + (FRONT_STACKS if kern.front is not None else ())
            + (ROUTE_STACKS if kern.norm_route is not None else ()) + (OUT_STACKS if kern.attention_projects else ())
            + (SHARED_STACKS if kern.route_moe is not None else ()))


class Kernels(NamedTuple):
    # (x [..., D], weight [D] (or [G, D] with layer), eps, layer=None, residual=None, x_weight=None) -> x's shape,
    # or with the residual stream given: (norm(x' + residual), x' + residual), x' = x, or norm(x, x_weight)
    rms_norm: Callable[..., Any]
    # (qkv [B, heads x D], q_norm, k_norm [D] (or [G, D] with layer), (cos, sin) [B, D], Front, layer=None)
    #   -> q, k, v [B, heads, D]
    qk_rope: Callable[..., Any]
    # (q, k, v, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, window, scale, layer): caches [L, pages, ...]
    attention: Callable[..., Any]
    moe: Callable[..., Any]  # (x, ids, weights, w_gate_up [L, E, ..], w_down [L, E, ..], activation, mesh, layer)
    # (x [B, H], router [H, E] (or [G, H, E] with layer), top_k, layer=None) -> ids [B, k] int32, weights [B, k] f32
    route: Callable[..., Any]
    # None, or the attention front in one call: (x, residual, norm [G, H], wqkv [G, H, heads x D], q_norm, k_norm
    # [G, D], (cos, sin), Front, layer) -> q, k, v [B, heads, D], x + residual; without it the step runs rms_norm,
    # the projection and qk_rope apart
    front: Callable[..., Any] | None = None
    # None, or the router with the norm before it in one call: (x, residual or None, norm [G, H], router [G, H, E],
    # top_k, eps, layer, expert_scale [G, E] or None) -> ids, weights, the normed x (, x + residual)
    norm_route: Callable[..., Any] | None = None
    # attention takes out_proj= (the output projection [G, heads x D, H], read at layer) and returns [B, H]
    attention_projects: bool = False
    # None, or the norm, the router and the experts in one op: (x, residual or None, norm [G, H], router [G, H, E],
    # top_k, eps, w_gate_up, w_down, activation, mesh, layer, expert_scale [G, E] or None, expert_norm [G, H] or
    # None, x_weight= x's own norm [G, H], shared= (gate, up, down) stacks of a shared MLP split over the mesh,
    # shared_norm= [G, H]) -> (the experts' output summed over the mesh,) + (x + residual,) with a residual +
    # (the shared MLP's output, summed in the same all-reduce,) with it
    route_moe: Callable[..., Any] | None = None
    # whether route_moe runs as one kernel for (tokens, model, mesh): only then does the step use it (its two-op
    # form would route inside, where the cost model's walk gives the experts a concrete routing)
    fuses_routing: Callable[..., bool] | None = None


def hub_kernels(rms: Any, fa: Any, rd: Any, implementation: str | None = None, interpret: Any = None,
                formulation: str | None = None, out_proj: bool = True) -> Kernels:
    """The step's ops from the loaded kernel packages (rms_norm, flash_attention, ragged_dot); `formulation`: how
    moe_experts runs each device's experts (None: its own choice, ragged_dot's moe/formulation.py); `out_proj`: the
    attention's output projection inside its call where the release takes it (False: an XLA dot after)."""
    kw = {"implementation": implementation, "interpret": interpret}

    sandwich = _takes(rms.rms_norm, "x_weight")

    def norm(x, w, eps, layer=None, residual=None, x_weight=None):
        if x_weight is not None and not sandwich:  # a release without the sandwich form: the inner norm apart
            x, x_weight = rms.rms_norm(x, x_weight, eps=eps, layer=layer, **kw), None
        return rms.rms_norm(x, w, eps=eps, layer=layer, residual=residual,
                            **({} if x_weight is None else {"x_weight": x_weight}), **kw)

    def qk_rope(qkv, qw, kw_, table, f: Front, layer=None):
        return rms.qk_norm_rope(qkv, qw, kw_, *table, q_heads=f.q_heads, kv_heads=f.kv_heads, eps=f.eps,
                                values=f.values, keys_are_values=f.keys_are_values, rotary_dims=f.rotary_dims,
                                layer=layer, **kw)

    projects = out_proj and _takes(getattr(fa, "ragged_paged_attention", None), "out_proj")

    def attention(q, k, v, kc, vc, kv_lens, pages, cu, window, scale, layer, out_proj=None):
        extra = {} if out_proj is None else {"out_proj": out_proj}
        return fa.ragged_paged_attention(q, k, v, kc, vc, kv_lens, pages, cu, layer=layer, sliding_window=window,
                                         sm_scale=scale, **extra, **kw)

    def moe(x, ids, w, gu, dn, activation, mesh, layer):
        return rd.moe_experts(x, ids, w, gu, dn, activation=activation, mesh=mesh,
                              expert_axis=None if mesh is None else AXIS, layer=layer, formulation=formulation, **kw)

    def route(x, w, k, layer=None):
        return rd.moe_route(x, w, top_k=k, layer=layer, **kw)

    def front(x, residual, norm_w, wqkv, qw, kw_, table, f: Front, layer):
        return rms.attention_front(x, norm_w, wqkv, qw, kw_, *table, residual=residual, q_heads=f.q_heads,
                                   kv_heads=f.kv_heads, eps=f.eps, values=f.values,
                                   keys_are_values=f.keys_are_values, rotary_dims=f.rotary_dims, layer=layer, **kw)

    def norm_route(x, residual, norm_w, w, k, eps, layer, expert_scale=None):
        return rd.moe_route(x, w, top_k=k, layer=layer, norm_weight=norm_w, residual=residual, eps=eps,
                            expert_scale=expert_scale, **kw)

    def route_moe(x, residual, norm_w, router, k, eps, gu, dn, activation, mesh, layer, expert_scale=None,
                  expert_norm=None, x_weight=None, shared=None, shared_norm=None):
        return rd.moe_routed_experts(x, router, gu, dn, top_k=k, norm_weight=norm_w, residual=residual, eps=eps,
                                     expert_scale=expert_scale, expert_norm_weight=expert_norm, x_weight=x_weight,
                                     shared_experts=shared, shared_norm_weight=shared_norm, activation=activation,
                                     mesh=mesh, expert_axis=None if mesh is None else AXIS, layer=layer, **kw)

    def fuses_routing(tokens: int, m: DecodeModel, mesh) -> bool:
        n = 1 if mesh is None else int(mesh.shape[AXIS])
        kind = None if mesh is None else getattr(mesh.devices.flat[0], "device_kind", None)
        return bool(kind) and rd.plan_routing(tokens, m.hidden, m.moe_intermediate, m.top_k, m.experts,
                                              m.experts // n, chip=kind, activation=m.activation)[0]

    has_front = _takes(getattr(rms, "attention_front", None), "residual", "layer")
    fused_route = _takes(rd.moe_route, "norm_weight", "residual", "expert_scale")
    routed = (implementation == "pallas" and interpret in (None, False) and formulation is None
              and hasattr(rd, "moe_routed_experts"))
    return Kernels(norm, qk_rope, attention, moe, route, front if has_front else None,
                   norm_route if fused_route else None, projects, route_moe if routed else None,
                   fuses_routing if routed else None)


def _takes(fn: Callable[..., Any] | None, *keywords: str) -> bool:
    """Whether a loaded kernel release has an entry point taking these keywords (an older one lacks the fused forms:
    the step then runs their parts apart)."""
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(k in params for k in keywords)


def transformers_kernels(rd: Any) -> Kernels:
    """transformers' decode math compiled whole: RMSNorm in XLA, attention over the whole static cache with K/V
    repeated to every query head, experts by the ragged dot's XLA path (one dense dot over the local experts)."""

    def norm(x, w, eps, layer=None, residual=None, x_weight=None):
        return xla_rms_norm(x, w, eps, layer, residual, x_weight)

    def moe(x, ids, w, gu, dn, activation, mesh, layer):
        return rd.moe_experts(x, ids, w, gu, dn, activation=activation, mesh=mesh,
                              expert_axis=None if mesh is None else AXIS, layer=layer, implementation="xla")

    return Kernels(norm, xla_qk_rope, repeat_kv_attention, moe, xla_route)


def xla_rms_norm(x, w, eps, layer=None, residual=None, x_weight=None):
    """RMSNorm in XLA; with `residual`, (norm(x + residual), x + residual), as transformers adds then normalises
    (x normed by x_weight first when given: a sandwich norm's post-norm)."""
    import jax.numpy as jnp

    if residual is not None:
        if x_weight is not None:
            x = xla_rms_norm(x, x_weight, eps, layer)
        total = x + residual
        return xla_rms_norm(total, w, eps, layer), total
    w = w if layer is None else w[layer]
    xf = x.astype(jnp.float32)
    y = xf * jax_rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * w.astype(jnp.float32)).astype(x.dtype)


class Front(NamedTuple):
    """One device's attention front of a layer kind: its heads and how q, k and v leave the norms."""

    q_heads: int
    kv_heads: int
    eps: float
    values: str  # "raw" | "normed"
    keys_are_values: bool
    rotary_dims: int


def xla_qk_rope(qkv, qw, kw, table, f: Front, layer=None):
    """transformers' attention front in XLA: per-head RMSNorm (q_norm, k_norm; v scale-free where the model has
    it), then the rotary embedding."""
    import jax.numpy as jnp

    if layer is not None:
        qw, kw = qw[layer], kw[layer]
    b = qkv.shape[0]
    x = qkv.reshape(b, -1, table[0].shape[-1])
    nq, nkv = f.q_heads, f.kv_heads
    q = rope(xla_rms_norm(x[:, :nq], qw, f.eps), table, f.rotary_dims)
    raw = x[:, nq:nq + nkv]
    k = rope(xla_rms_norm(raw, kw, f.eps), table, f.rotary_dims)
    v = raw if f.keys_are_values else x[:, nq + nkv:]
    if f.values == "normed":
        v = xla_rms_norm(v, jnp.ones((v.shape[-1],), v.dtype), f.eps)
    return q, k, v


def xla_route(x, w, k, layer=None):
    """transformers' router in XLA: f32 logits, top k, the softmax over those k (a softmax over every expert
    renormalised over the k is the same numbers)."""
    import jax
    import jax.numpy as jnp

    w = w if layer is None else w[layer]
    top, ids = jax.lax.top_k(jnp.dot(x, w, preferred_element_type=jnp.float32), k)
    return ids.astype(jnp.int32), jax.nn.softmax(top, axis=-1)


def jax_rsqrt(x):
    import jax

    return jax.lax.rsqrt(x)


def repeat_kv_attention(q, k, v, kc, vc, kv_lens, pages, cu, window, scale, layer):
    """Decode attention as transformers runs it on a static cache: write the new K/V, read every sequence's whole
    cache, repeat K/V to the query heads, mask past the length (and outside the window), softmax in f32. The caches
    are stacks over layers [L, pages, ...], layer `layer` written and read."""
    import jax.numpy as jnp

    b, hq, d = q.shape
    hkv = k.shape[1]
    pos = kv_lens - 1
    page, slot = pages[jnp.arange(b), pos // PAGE], pos % PAGE
    kc = kc.at[layer, page, slot].set(k)
    vc = vc.at[layer, page, slot].set(v)
    keys = kc[layer, pages].reshape(b, -1, hkv, d)  # [B, S, Hkv, D]
    vals = vc[layer, pages].reshape(b, -1, hkv, d)
    keys, vals = (jnp.repeat(a, hq // hkv, axis=2) for a in (keys, vals))
    s = jnp.einsum("bhd,bshd->bhs", q.astype(jnp.float32), keys.astype(jnp.float32)) * scale
    at = jnp.arange(keys.shape[1])[None, None, :]
    ok = at <= pos[:, None, None]
    if window is not None:
        ok &= at > pos[:, None, None] - window
    p = jax_softmax(jnp.where(ok, s, -jnp.inf))
    out = jnp.einsum("bhs,bshd->bhd", p, vals.astype(jnp.float32))
    return out.astype(q.dtype), kc, vc


def jax_softmax(s):
    import jax

    return jax.nn.softmax(s, axis=-1)


# ------------------------------------------------------------------------------------------- parameters

def layer_shapes(m: DecodeModel, kind: AttentionKind, n: int) -> dict[str, tuple[tuple[int, ...], tuple]]:
    """name -> (global shape of one layer's weight, its partition over the mesh axis); KV heads stored replicated
    to n * (per-device heads) so each device holds the heads its query heads read."""
    h, d, e, i = m.hidden, kind.head_dim, m.experts, m.moe_intermediate
    kv = n * kv_heads_per_device(kind.kv_heads, n) * d
    out: dict[str, tuple[tuple[int, ...], tuple]] = {
        "attn_norm": ((h,), (None,)), "ff_norm": ((h,), (None,)),
        "wqkv": ((h, m.q_heads * d + kv * (1 if kind.k_eq_v else 2)), (None, AXIS)),
        "wo": ((m.q_heads * d, h), (AXIS, None)), "q_norm": ((d,), (None,)), "k_norm": ((d,), (None,)),
        "router": ((h, e), (None, None)),
        "w_gate_up": ((e, h, 2 * i), (AXIS, None, None)), "w_down": ((e, i, h), (AXIS, None, None)),
    }
    if m.sandwich_norms:
        for name in ("attn_post_norm", "ff_post_norm", "moe_pre_norm", "moe_post_norm", "shared_post_norm",
                     "router_scale"):
            out[name] = ((h,), (None,))
        out["expert_scale"] = ((e,), (None,))
    if m.shared_intermediate:
        s = m.shared_intermediate
        out |= {"ws_gate": ((h, s), (None, AXIS)), "ws_up": ((h, s), (None, AXIS)), "ws_down": ((s, h), (AXIS, None))}
    return out


def global_shapes(m: DecodeModel) -> dict[str, tuple[tuple[int, ...], tuple]]:
    out = {"embed": ((m.vocab, m.hidden), (AXIS, None)), "final_norm": ((m.hidden,), (None,))}
    if not m.tied_embeddings:
        out["lm_head"] = ((m.vocab, m.hidden), (AXIS, None))
    return out


def cache_shape(kind: AttentionKind, n: int, batch: int, cache: int) -> tuple[int, ...]:
    """One layer's K (or V) cache: [pages, PAGE, n x per-device KV heads, head_dim], sharded on the heads."""
    return batch * math.ceil(cache / PAGE), PAGE, n * kv_heads_per_device(kind.kv_heads, n), kind.head_dim


def abstract_inputs(m: DecodeModel, n: int, batch: int, cache: int, dtype: Any, mesh: Mesh | None = None
                    ) -> tuple[dict, list, jax.ShapeDtypeStruct]:
    """(params, caches, tokens) as ShapeDtypeStructs, with NamedShardings on `mesh` when given: the step compiles
    without one byte allocated."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def sds(shape, spec, dt=dtype):
        sharding = None if mesh is None else NamedSharding(mesh, P(*spec))
        return jax.ShapeDtypeStruct(shape, dt, sharding=sharding)

    g = m.groups
    layers = [{k: sds((g, *s), (None, *p), jnp.float32 if k == "expert_scale" else dtype)
               for k, (s, p) in layer_shapes(m, kind, n).items()} for kind in m.pattern]
    params = {"layers": layers, **{k: sds(s, p) for k, (s, p) in global_shapes(m).items()}}
    caches = [tuple(sds((g, *cache_shape(kind, n, batch, cache)), (None, None, None, AXIS, None)) for _ in range(2))
              for kind in m.pattern]
    return params, caches, sds((batch,), (None,), jnp.int32)


def init_inputs(m: DecodeModel, n: int, batch: int, cache: int, dtype: Any, key: jax.Array) -> tuple[dict, list]:
    """Random params and caches of the abstract_inputs shapes (weights ~ 1/sqrt(fan-in), norms near 1)."""
    import jax

    params, caches, _ = abstract_inputs(m, n, batch, cache, dtype)
    leaves, tree = jax.tree.flatten((params, caches))
    keys = jax.random.split(key, len(leaves))
    out = []
    for k, a in zip(keys, leaves, strict=True):
        if (len(a.shape) <= 2 and a.shape[-1] in (m.hidden, m.experts) and a.shape[0] == m.groups) or len(a.shape) == 1:
            v = 1.0 + 0.1 * jax.random.normal(k, a.shape)
        else:
            v = jax.random.normal(k, a.shape) / math.sqrt(a.shape[-2] if len(a.shape) >= 3 else a.shape[0])
        out.append(v.astype(a.dtype))
    return jax.tree.unflatten(tree, out)


# ------------------------------------------------------------------------------------------- the step

def rotated_dims(kind: AttentionKind) -> int:
    return int(kind.head_dim * kind.rotary_fraction) // 2 * 2


def rope_table(pos, kind: AttentionKind):
    """(cos, sin) [B, D] f32 at positions pos [B] for an attention kind, laid out over the whole head: cos on
    both halves of the rotated dims and 1 past them, sin negated on the first half, +sin on the second, 0 past
    them (qk_norm_rope's tables). The same for every layer of that kind, so the step computes them once, not
    once a layer."""
    import jax.numpy as jnp

    d, rot = kind.head_dim, rotated_dims(kind)
    inv = 1.0 / kind.rope_theta ** (jnp.arange(0, rot, 2, dtype=jnp.float32) / rot)
    ang = pos.astype(jnp.float32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    one, zero = jnp.ones_like(cos[..., :1]), jnp.zeros_like(cos[..., :1])
    rest = (cos.shape[0], d - rot)
    return (jnp.concatenate([cos, cos, jnp.broadcast_to(one, rest)], -1),
            jnp.concatenate([-sin, sin, jnp.broadcast_to(zero, rest)], -1))


def rope(x, table, rot: int):
    """Rotary embedding of x [B, heads, D] on its first `rot` dims (halves rotated) by rope_table's (cos, sin):
    x * cos + swap(x) * sin, swap exchanging the two halves of the rotated dims (past them it meets sin = 0, so
    those dims stay x exactly): one elementwise expression over the head, the same products and sums as
    a * cos - b * sin, b * cos + a * sin."""
    import jax.numpy as jnp

    cos, sin = (t[:, None, :] for t in table)
    xf = x.astype(jnp.float32)
    half = rot // 2
    swapped = jnp.concatenate([xf[..., half:rot], xf[..., :half], xf[..., rot:]], axis=-1)
    return (xf * cos + swapped * sin).astype(x.dtype)


def attention_part(m: DecodeModel, kind: AttentionKind, kern: Kernels, lw: dict, h, pending, kc, vc, kv_lens, pages,
                   table, layer, reduce: Callable[[Any], Any], heads: tuple[int, int]):
    """One device's attention of a layer (query heads and KV heads local), its output summed over the axis by
    `reduce`; `table` the kind's rope_table; kc, vc the kind's caches stacked over the groups, `layer` the group.
    `pending`: the previous layer's output, not yet added to the residual stream `h`: the input norm adds it (one
    kernel for the add and the norm). Returns (h with `pending` added, the attention's output (not yet added, nor
    post-normed: ff_inputs' norm does both), k_cache, v_cache: the whole stacks, that group's rows written)."""
    import jax.numpy as jnp

    b, d = h.shape[0], kind.head_dim
    front = Front(heads[0], heads[1], m.eps, "normed" if m.v_norm else "raw", kind.k_eq_v, rotated_dims(kind))
    if kern.front is not None:  # the residual add, the norm, the projection and the q/k norms + rotary: one call
        q, k, v, h = kern.front(pending, h, lw["attn_norm"], lw["wqkv"], lw["q_norm"], lw["k_norm"], table, front,
                                layer)
    else:
        x, h = kern.rms_norm(pending, lw["attn_norm"], m.eps, layer, h)
        # one dot for the three projections ([B, heads x D], query heads, then key, then value heads), then the
        # q/k norms and the rotary embedding in one call that hands the attention [B, heads, D]
        q, k, v = kern.qk_rope(x @ lw["wqkv"], lw["q_norm"], lw["k_norm"], table, front, layer)
    scale = m.attention_scale if m.attention_scale is not None else 1.0 / math.sqrt(d)
    cu = jnp.arange(b + 1, dtype=jnp.int32)
    if kern.attention_projects:  # the o-projection inside the attention call (the whole stack, read at layer)
        o, kc, vc = kern.attention(q, k, v, kc, vc, kv_lens, pages, cu, kind.window, scale, layer, out_proj=lw["wo"])
        return h, reduce(o), kc, vc
    o, kc, vc = kern.attention(q, k, v, kc, vc, kv_lens, pages, cu, kind.window, scale, layer)
    out = reduce(o.reshape(b, -1) @ lw["wo"])  # a sandwich model's post-norm runs in the next norm's call
    return h, out, kc, vc


def router(m: DecodeModel, kern: Kernels, lw: dict, h, x, layer):
    """(ids [B, k], weights [B, k] f32): softmax over the experts, top-k, renormalised (Gemma: its own scale-free
    norm of the residual and a per-expert scale), by the route op on the layer's router weight: computed as the
    softmax of the top-k logits, the same numbers (the softmax is monotone and its normaliser cancels in the
    renormalisation), with no full softmax over every expert."""
    import jax.numpy as jnp

    if m.sandwich_norms and kern.norm_route is not None:  # the router's norm and per-expert scale in its call
        ids, w, _ = kern.norm_route(h, None, lw["router_norm"], lw["router"], m.top_k, m.eps, layer,
                                    lw["expert_scale"])
        return ids, w
    if m.sandwich_norms:
        r = xla_rms_norm(h, jnp.ones((m.hidden,), h.dtype), m.eps) * lw["router_scale"] * m.hidden ** -0.5
    else:
        r = x
    ids, w = kern.route(r, lw["router"], m.top_k, layer)
    if m.sandwich_norms:
        w = w * lw["expert_scale"][ids]
    return ids, w


def ff_inputs(m: DecodeModel, kern: Kernels, lw: dict, h, attn_out, layer, reduce: Callable[[Any], Any]):
    """One device's part before the experts: (the experts' input, ids, weights, the shared MLP's output or None, h
    with the attention's output added: the norm adds it); the norms' weights are stacks read at `layer`."""
    if kern.norm_route is not None and not m.sandwich_norms:  # the add, this norm and the router: one call
        ids, w, x, h = kern.norm_route(attn_out, h, lw["ff_norm"], lw["router"], m.top_k, m.eps, layer)
    else:
        post = lw["attn_post_norm"] if m.sandwich_norms else None  # the attention's post-norm, the add, this norm
        x, h = kern.rms_norm(attn_out, lw["ff_norm"], m.eps, layer, h, x_weight=post)
        ids, w = router(m, kern, lw, h, x, layer)
    shared = None
    if m.shared_intermediate:
        import jax

        at = lambda k: lw[k] if lw[k].ndim == 2 else lw[k][layer]  # a whole stack where route_moe could take it
        g = jax.nn.gelu(x @ at("ws_gate"), approximate=True)
        shared = kern.rms_norm(reduce((g * (x @ at("ws_up"))) @ at("ws_down")), lw["shared_post_norm"], m.eps,
                               layer)
        x = kern.rms_norm(h, lw["moe_pre_norm"], m.eps, layer)
    return x, ids, w, shared, h


def ff_output(m: DecodeModel, kern: Kernels, lw: dict, moe_out, shared, layer, shared_normed: bool = True):
    """The layer's output, to be added to the residual stream by the next norm (the next layer's input norm, or the
    final norm); `shared_normed` False: the shared MLP's summed output still wants its post-norm."""
    if not m.sandwich_norms:
        return moe_out
    if not shared_normed:
        shared = kern.rms_norm(shared, lw["shared_post_norm"], m.eps, layer)
    # ff_post_norm(moe_post_norm(moe_out) + shared): the sandwich form, one call
    return kern.rms_norm(moe_out, lw["ff_post_norm"], m.eps, layer, shared, x_weight=lw["moe_post_norm"])[0]


def routes_in_experts(m: DecodeModel, kern: Kernels, tokens: int, mesh: Mesh) -> bool:
    """Whether the step runs the router (with its norm, and Gemma's scale and pre-experts norm) inside the experts'
    call for `tokens` on `mesh`; then a shared MLP's partial sums ride the experts' all-reduce (one collective a
    layer fewer)."""
    if kern.route_moe is None or (m.sandwich_norms and kern.norm_route is None):
        return False
    return bool(kern.fuses_routing(tokens, m, mesh))


def decode_step(params: dict, caches: list, tokens, kv_lens, page_indices, *, model: DecodeModel, kernels: Kernels,
                mesh: Mesh, routing: list | None = None, layers: bool = True):
    """One decode step (see the module docstring); caches [(k, v) per pattern position], each [G, pages, ...].
    layers=False (with a routing) leaves the layers out: the embedding and the LM head alone, for the cost model."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    m, kern, n = model, kernels, int(mesh.shape[AXIS])
    dt = params["embed"].dtype
    psum = functools.partial(jax.lax.psum, axis_name=AXIS)
    smap = functools.partial(jax.shard_map, mesh=mesh, check_vma=False)
    whole = whole_stacks(kern)
    lspecs = [{k: P(None, *p) if k in whole else P(*p) for k, (_, p) in layer_shapes(m, kind, n).items()
               if k not in EXPERT_WEIGHTS} for kind in m.pattern]
    # a router's norm with a scale-free norm of its own (Gemma): its weight, router_scale / sqrt(hidden), made once
    # a step from the whole stack (below), not once a layer
    router_norm = m.sandwich_norms and kern.norm_route is not None
    if router_norm:
        for spec in lspecs:
            spec["router_norm"] = spec.pop("router_scale")
    cspec = P(None, None, None, AXIS, None)  # [G, pages, PAGE, KV heads, D]: the whole stacks, heads split

    def embed(table, tok):
        vl = table.shape[0]
        local = tok - jax.lax.axis_index(AXIS) * vl
        hit = (local >= 0) & (local < vl)
        rows = jnp.where(hit[:, None], table[jnp.clip(local, 0, vl - 1)], 0)
        h = psum(rows)
        return (h * jnp.asarray(math.sqrt(m.hidden), dt)).astype(dt) if m.embed_scale else h

    h = smap(embed, in_specs=(P(AXIS, None), P()), out_specs=P())(params["embed"], tokens)

    # the experts' and the norms' weights stay whole stacks [G, ...]: their kernels read group i's layer in place
    experts = [(lw["w_gate_up"], lw["w_down"]) for lw in params["layers"]]
    stacks = [{k: a for k, a in lw.items() if k in whole} for lw in params["layers"]]
    if router_norm:
        for st in stacks:
            st["router_norm"] = (st.pop("router_scale").astype(jnp.float32) * m.hidden ** -0.5).astype(dt)
    scanned = [{k: a for k, a in lw.items() if k not in EXPERT_WEIGHTS + whole} for lw in params["layers"]]
    # the rotary angles depend on the positions and the kind only: once a step, not once a layer
    angles = {}
    for kind in m.pattern:
        key = (kind.head_dim, kind.rope_theta, kind.rotary_fraction)
        angles[key] = angles.get(key) or rope_table(kv_lens - 1, kind)
    tables = [angles[(kind.head_dim, kind.rope_theta, kind.rotary_fraction)] for kind in m.pattern]

    routed = routes_in_experts(m, kern, int(tokens.shape[0]), mesh)

    def group(h, pending, lws, cs, i):
        new = []
        for p, kind in enumerate(m.pattern):
            lw, (kc, vc) = {**lws[p], **stacks[p]}, cs[p]
            heads = (m.q_heads // n, kv_heads_per_device(kind.kv_heads, n))
            att = smap(functools.partial(attention_part, m, kind, kern, reduce=psum, heads=heads),
                       in_specs=(lspecs[p], P(), P(), cspec, cspec, P(), P(), P(), P()),
                       out_specs=(P(), P(), cspec, cspec))
            h, attn_out, kc, vc = att(lw, h, pending, kc, vc, kv_lens, page_indices, tables[p], i)
            if routed and not m.sandwich_norms:  # the add, the norm, the router and the experts: one kernel
                out, h = kern.route_moe(attn_out, h, lw["ff_norm"], lw["router"], m.top_k, m.eps, *experts[p],
                                        m.activation, mesh, i)
                shared = None
            elif routed:  # the attention's post-norm and the add, the router's, the experts' and the shared MLP's
                # norms, the router, the shared MLP and the experts: one kernel, one all-reduce of both outputs
                out, h, shared = kern.route_moe(attn_out, h, lw["router_norm"], lw["router"], m.top_k, m.eps,
                                                *experts[p], m.activation, mesh, i, lw["expert_scale"],
                                                lw["moe_pre_norm"], x_weight=lw["attn_post_norm"],
                                                shared=tuple(lw[k] for k in SHARED_STACKS), shared_norm=lw["ff_norm"])
            else:
                pre = smap(functools.partial(ff_inputs, m, kern, reduce=psum), in_specs=(lspecs[p], P(), P(), P()),
                           out_specs=(P(), P(), P(), P(), P()))
                x, ids, w, shared, h = pre(lw, h, attn_out, i)
                if routing is not None:
                    ids, w = routing[p]
                out = kern.moe(x, ids, w, *experts[p], m.activation, mesh, i)
            if m.sandwich_norms:  # the norms after the experts are kernels too: one device's copy each
                post = smap(functools.partial(ff_output, m, kern, shared_normed=not routed),
                            in_specs=(lspecs[p], P(), P(), P()), out_specs=P())
                pending = post(lw, out, shared, i)
            else:
                pending = ff_output(m, kern, lw, out, shared, i)
            new.append((kc, vc))
        return h, pending, new

    # each layer's output rides to the next norm, which adds it to the residual stream (one kernel, no add op)
    pending = jnp.zeros_like(h)
    if routing is None:  # the whole cache stacks ride in the carry; the attention writes group i's rows in place
        def body(carry, lws):
            h, pending, cs, i = carry
            h, pending, cs = group(h, pending, lws, cs, i)
            return (h, pending, cs, i + 1), None

        (h, pending, caches, _), _ = jax.lax.scan(body, (h, pending, caches, jnp.int32(0)), scanned,
                                                  length=m.groups)
    elif layers:  # one group, unscanned (the cost model's walk; params and caches hold one group)
        h, pending, caches = group(h, pending, [jax.tree.map(lambda a: a[0], lw) for lw in scanned], caches,
                                   jnp.int32(0))

    def head(h, pending, norm_w, table):
        x, _ = kern.rms_norm(pending, norm_w, m.eps, None, h)
        logits = jax.lax.dot_general(x, table, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        if m.logit_softcap:
            logits = jnp.tanh(logits / m.logit_softcap) * m.logit_softcap
        best = jnp.max(logits, axis=-1)
        idx = jnp.argmax(logits, axis=-1).astype(jnp.int32) + jax.lax.axis_index(AXIS) * table.shape[0]
        all_best, all_idx = (jax.lax.all_gather(a, AXIS) for a in (best, idx))  # [n, B]
        return jnp.take_along_axis(all_idx, jnp.argmax(all_best, axis=0)[None], axis=0)[0]

    table = params["embed"] if m.tied_embeddings else params["lm_head"]
    nxt = smap(head, in_specs=(P(), P(), P(), P(AXIS, None)), out_specs=P())(h, pending, params["final_norm"], table)
    return nxt, caches
