"""Runs in a subprocess with 8 simulated CPU devices (tests/simulated_devices.run_worker): moe_routed_experts'
fused kernel (interpreted) expert-parallel over the 8 devices, with each device's partial sums of another output
riding the experts' all-reduce (reduce_with), against the same op on one device and a float64 NumPy layer; and
Gemma 4's form (x's own norm, a shared MLP split over the devices), the fused kernel against the two ops.
Prints one JSON object; tests/kernel_builds/test_moe_routed_mesh.py owns the verdicts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
T, H, INTER, E, K, N = 13, 128, 40, 16, 4, 24  # T off the kernel's 16-row tile; two experts a device


def reference(x, r, nw, router, gu, down, eps=1e-6):
    """(out, x + r) in float64 from the f32 inputs: the sum, the RMSNorm, the top k logits' softmax, each expert."""
    total = x + r
    y = total / np.sqrt(np.mean(total * total, 1, keepdims=True) + eps) * nw
    logits = y @ router
    ids = np.argsort(-logits, 1, kind="stable")[:, :K]
    top = np.take_along_axis(logits, ids, 1)
    p = np.exp(top - top[:, :1])
    wts = p / p.sum(1, keepdims=True)
    out = np.zeros_like(total)
    for t in range(T):
        for j in range(K):
            hgu = y[t] @ gu[ids[t, j]]
            out[t] += wts[t, j] * ((hgu[:INTER] / (1 + np.exp(-hgu[:INTER])) * hgu[INTER:]) @ down[ids[t, j]])
    return out, total


def main() -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import kernel_hub as kh
    from kernel_hub.verify.numerics import relative_error

    rd = kh.get_local_kernel(HERE.parent / "kernels/pallas/ragged_dot")
    rng = np.random.default_rng(0)
    f32 = lambda shape, scale=1.0, shift=0.0: (rng.standard_normal(shape) * scale + shift).astype(np.float32)
    x, r, nw = f32((T, H), 2.0), f32((T, H)), f32((H,), 0.2, 1.0)
    router, gu, down = f32((H, E), 3 * H ** -0.5), f32((E, H, 2 * INTER), H ** -0.5), f32((E, INTER, H), INTER ** -0.5)
    parts = f32((8 * T, N))  # device d's partial sums: rows d*T .. (d+1)*T
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    put = lambda a, spec: jax.device_put(jnp.asarray(a), NamedSharding(mesh, spec))
    kw = {"top_k": K, "norm_weight": put(nw, P()), "residual": put(r, P()), "fuse": True, "implementation": "pallas",
          "interpret": True}
    out8, total8, summed = rd.moe_routed_experts(put(x, P()), put(router, P()), put(gu, P("x")), put(down, P("x")),
                                                 mesh=mesh, expert_axis="x", reduce_with=put(parts, P("x")), **kw)
    why = rd.last_implementation()[1]
    # Gemma 4's form: x under its own norm, a shared MLP split over the devices along its columns, both outputs in
    # one all-reduce; the fused kernel against the two ops on the same mesh and on one device
    xw, sn = f32((H,), 0.2, 1.0), f32((H,), 0.2, 1.0)
    sg, su, sd = f32((H, 8 * 16), H ** -0.5), f32((H, 8 * 16), H ** -0.5), f32((8 * 16, H), (8 * 16) ** -0.5)
    gemma = {"x_weight": xw, "shared_norm_weight": sn, "activation": "gelu"}
    on_mesh = {"x_weight": put(xw, P()), "shared_norm_weight": put(sn, P()), "activation": "gelu",
               "shared_experts": (put(sg, P(None, "x")), put(su, P(None, "x")), put(sd, P("x", None)))}
    forms = {}
    for fuse in (True, False):
        forms[fuse] = rd.moe_routed_experts(put(x, P()), put(router, P()), put(gu, P("x")), put(down, P("x")),
                                            mesh=mesh, expert_axis="x", **{**kw, "fuse": fuse}, **on_mesh)
    one = rd.moe_routed_experts(jnp.asarray(x), jnp.asarray(router), jnp.asarray(gu), jnp.asarray(down),
                                **{**kw, "norm_weight": jnp.asarray(nw), "residual": jnp.asarray(r), "fuse": False},
                                shared_experts=(jnp.asarray(sg), jnp.asarray(su), jnp.asarray(sd)), **gemma)
    gap = lambda a, b: float(max(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64)))
                                 for u, v in zip(a, b, strict=True)))
    out1, total1 = rd.moe_routed_experts(jnp.asarray(x), jnp.asarray(router), jnp.asarray(gu), jnp.asarray(down),
                                         **{**kw, "norm_weight": jnp.asarray(nw), "residual": jnp.asarray(r)})
    want, want_total = reference(*(a.astype(np.float64) for a in (x, r, nw, router, gu, down)))
    print(json.dumps({
        "why": why,
        "finite": bool(np.isfinite(np.asarray(out8)).all()),
        "mesh_vs_float64": float(relative_error(np.asarray(out8), want)),
        "one_vs_float64": float(relative_error(np.asarray(out1), want)),
        "mesh_vs_one": float(np.max(np.abs(np.asarray(out8) - np.asarray(out1)))),
        "total_exact": bool(np.array_equal(np.asarray(total8), np.asarray(total1)))
        and float(np.max(np.abs(np.asarray(total8, np.float64) - want_total))) < 1e-6,
        "summed_err": float(np.max(np.abs(np.asarray(summed, np.float64)
                                          - parts.astype(np.float64).reshape(8, T, N).sum(0)))),
        "summed_shape": list(np.asarray(summed).shape),
        "shared_outputs": len(forms[True]),
        "shared_fused_vs_two_ops": gap(forms[True], forms[False]),
        "shared_mesh_vs_one": gap(forms[True], one),
        "shared_scale": float(np.max(np.abs(np.asarray(one[2])))),
    }))


if __name__ == "__main__":
    sys.exit(main())
