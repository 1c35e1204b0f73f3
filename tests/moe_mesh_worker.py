"""Runs in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8 (so the test suite keeps one device):
moe_experts on 1 device, expert-parallel over 8 simulated CPU devices and over a 4x2 (expert x tensor) mesh, every
dispatch scheme, f32 and bf16, against the float64 NumPy forward (reference_moe_experts) and backward
(moe_reference_grads.py), and against each other. Prints one JSON object; tests/kernel_builds/test_moe_mesh.py owns the
verdicts.

    python tests/moe_mesh_worker.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

T, H, INTER, E, K = 13, 32, 16, 16, 4  # T not a multiple of 8 (or of 4)
#: experts no token picks: 8 and 9 are both of device 4's experts on the 8-way mesh, 2 and 14 half of a device's
EMPTY = (2, 8, 9, 14)
HOT = 5  # in every token's top-k: holds most rows
#: bf16 runs these (each config is one compilation of its forward and backward); f32 runs every config
BF16_CONFIGS = ("1dev", "ep8:psum", "ep8:all_to_all", "ep4xtp2:psum")


def routings(rng: np.random.Generator) -> dict[str, np.ndarray]:
    live = [e for e in range(E) if e not in EMPTY and e != HOT]
    skewed = np.stack([np.concatenate([[HOT], rng.choice(live, K - 1, replace=False)]) for _ in range(T)])
    # every token on the same four experts (4..7): two devices of eight get every row, six get none
    one_place = np.tile(np.arange(4, 4 + K), (T, 1))
    return {"skewed_empty": rng.permuted(skewed, axis=1).astype(np.int32), "one_place": one_place.astype(np.int32)}


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.random((T, K)).astype(np.float32)
    return {
        "x": rng.standard_normal((T, H)).astype(np.float32),
        "w": (w / w.sum(1, keepdims=True)).astype(np.float32),
        "wgu": (rng.standard_normal((E, H, 2 * INTER)) / np.sqrt(H)).astype(np.float32),
        "wd": (rng.standard_normal((E, INTER, H)) / np.sqrt(INTER)).astype(np.float32),
        "dout": rng.standard_normal((T, H)).astype(np.float32),
        **routings(rng),
    }


def _call(rd, x, ids, w, gu, d, kw):
    """moe_experts; under a tensor split with w_gate_up as the (gate, up) pair, the storage that split wants."""
    if kw.get("tensor_axis"):
        inter = d.shape[1]
        gu = (gu[..., :inter], gu[..., inter:])
    return rd.moe_experts(x, ids, w, gu, d, **kw)


def main() -> dict:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh
    from moe_reference_grads import moe_grads

    import kernel_hub as kh
    from kernel_hub.verify.numerics import relative_error

    rd = kh.get_local_kernel(HERE.parent / "kernels/pallas/ragged_dot")
    devices = np.array(jax.devices())
    assert devices.size == 8, f"expected 8 simulated devices, got {devices.size}"
    meshes = {"ep8": (Mesh(devices, ("expert",)), None), "ep4xtp2": (Mesh(devices.reshape(4, 2), ("expert", "tensor")),
                                                                      "tensor")}
    configs: list[tuple[str, dict]] = [("1dev", {})]
    for name, (mesh, ta) in meshes.items():
        for scheme in rd.SCHEMES:
            configs.append((f"{name}:{scheme}", {"mesh": mesh, "expert_axis": "expert", "tensor_axis": ta,
                                                 "dispatch": scheme}))
    data = inputs()
    rows, outs = [], {}
    for dtype in ("float32", "bfloat16"):
        x, w, wgu, wd = (jnp.asarray(data[n], dtype) for n in ("x", "w", "wgu", "wd"))
        dout = jnp.asarray(data["dout"])  # the cotangent of the output (the gradient of sum(out * dout))
        for routing in ("skewed_empty", "one_place"):
            ids = jnp.asarray(data[routing])
            ref = rd.reference_moe_experts(x, ids, w, wgu, wd, "silu")
            ref_grads = moe_grads(x, ids, w, wgu, wd, dout, "silu")
            for name, kw in configs:
                if dtype == "bfloat16" and name not in BF16_CONFIGS:
                    continue
                start = time.perf_counter()
                out, pullback = jax.vjp(lambda *a, kw=kw, ids=ids: _call(rd, a[0], ids, *a[1:], kw), x, w, wgu, wd)
                grads = pullback(dout.astype(out.dtype))
                seconds = time.perf_counter() - start
                outs[(dtype, routing, name)] = (np.asarray(out, np.float64), [np.asarray(g, np.float64) for g in grads])
                rows.append({"config": name, "dtype": dtype, "routing": routing, "seconds": seconds,
                             "fwd_error": relative_error(out, ref),
                             "grad_errors": [relative_error(g, r) for g, r in zip(grads, ref_grads, strict=True)]})
    for row in rows:  # each config against one device
        base_out, base_grads = outs[(row["dtype"], row["routing"], "1dev")]
        out, grads = outs[(row["dtype"], row["routing"], row["config"])]
        row["vs_1dev"] = max([relative_error(out, base_out)]
                             + [relative_error(g, b) for g, b in zip(grads, base_grads, strict=True)])
    extra = []
    # GELU (Gemma 4) on the 8-way mesh, and the Pallas kernel (interpreted) inside the shard_map
    x, w, wgu, wd = (jnp.asarray(data[n]) for n in ("x", "w", "wgu", "wd"))
    ids = jnp.asarray(data["skewed_empty"])
    mesh8 = meshes["ep8"][0]
    for label, kw in (("ep8:psum:gelu", {"activation": "gelu"}),
                      ("ep8:psum:pallas", {"implementation": "pallas", "interpret": True}),
                      ("ep4xtp2:psum:fused_gate_up", {"mesh": meshes["ep4xtp2"][0], "tensor_axis": "tensor"})):
        kw = {"mesh": mesh8, "expert_axis": "expert", **kw}  # the fused [E,H,2I] array, split inside the call
        act = kw.get("activation", "silu")
        out = rd.moe_experts(x, ids, w, wgu, wd, **kw)
        entry = {"config": label, "fwd_error": relative_error(out, rd.reference_moe_experts(x, ids, w, wgu, wd, act)),
                 "implementation": rd.last_implementation()[0]}
        if act == "gelu":
            grads = jax.vjp(lambda *a, kw=kw: _call(rd, a[0], ids, *a[1:], kw), x, w, wgu, wd)[1](
                jnp.asarray(data["dout"]))
            entry["grad_errors"] = [relative_error(g, r) for g, r in zip(
                grads, moe_grads(x, ids, w, wgu, wd, data["dout"], "gelu"), strict=True)]
        extra.append(entry)
    # weights stacked over 3 layers, layer 1 read in place (the decode step's scan), expert-parallel over 8
    rng = np.random.default_rng(1)
    gu_stack = jnp.stack([jnp.asarray(rng.standard_normal(wgu.shape) / np.sqrt(H), jnp.float32), wgu,
                          jnp.asarray(rng.standard_normal(wgu.shape) / np.sqrt(H), jnp.float32)])
    down_stack = jnp.stack([jnp.asarray(rng.standard_normal(wd.shape) / np.sqrt(INTER), jnp.float32), wd,
                            jnp.asarray(rng.standard_normal(wd.shape) / np.sqrt(INTER), jnp.float32)])
    ref = rd.reference_moe_experts(x, ids, w, wgu, wd, "silu")
    for label, kw in (("ep8:psum:pallas:stacked", {"implementation": "pallas", "interpret": True,
                                                   "dispatch": "psum"}),
                      ("ep8:all_to_all:stacked", {"dispatch": "all_to_all"})):
        out = jax.jit(lambda a, b, i, kw=kw: rd.moe_experts(x, ids, w, a, b, mesh=mesh8, expert_axis="expert",
                                                            layer=i, **kw))(gu_stack, down_stack, jnp.int32(1))
        extra.append({"config": label, "fwd_error": relative_error(out, ref),
                      "vs_unstacked": relative_error(out, rd.moe_experts(x, ids, w, wgu, wd, mesh=mesh8,
                                                                         expert_axis="expert", **kw))})
    return {"devices": int(devices.size), "rows": rows, "extra": extra}


if __name__ == "__main__":
    print(json.dumps(main()))
