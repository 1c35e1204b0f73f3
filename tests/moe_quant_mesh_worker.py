"""Runs in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8: moe_experts on quantized weights
(int8 per-channel, fp8 128x128 blocks) on one device, expert-parallel over 8 simulated CPU devices and over a 4x2
(expert x tensor) mesh, against the float64 NumPy forward of the dequantized weights (reference_moe_experts) and the
one-device result; the gradient in x against the one-device gradient. Prints one JSON object;
tests/kernel_builds/test_moe_quant_mesh.py owns the verdicts.

    python tests/moe_quant_mesh_worker.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "kernels/pallas/ragged_dot/tests"))

T, H, INTER, E, K = 13, 128, 256, 8, 2  # I / 2 = 128: fp8 blocks split whole over the tensor axis
CONFIGS = ("1dev", "ep8:all_to_all", "ep4xtp2:psum", "ep4xtp2:fused")


def main() -> dict:
    import jax
    import jax.numpy as jnp
    from quant_testutil import quantize

    from kernel_hub import get_local_kernel

    rd = get_local_kernel(ROOT / "kernels/pallas/ragged_dot")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
    ids[ids == 6] = 5  # expert 6 gets no token
    ids[:, 0] = np.where(ids[:, 1] == 2, 0, 2)  # expert 2 in most tokens' top-k
    w = rng.random((T, K)).astype(np.float32)
    dout = rng.standard_normal((T, H)).astype(np.float32)
    rows = []
    for fmt in ("int8", "fp8"):
        qg, sg, gu64 = quantize(rng.standard_normal((E, H, 2 * INTER)) / np.sqrt(H), fmt)
        qd, sd, d64 = quantize(rng.standard_normal((E, INTER, H)) / np.sqrt(INTER), fmt)
        ref = rd.reference_moe_experts(x, ids, w, gu64, d64)
        half = sg.shape[2] // 2
        pair, pair_s = (jnp.asarray(qg[..., :INTER]), jnp.asarray(qg[..., INTER:])), \
            (jnp.asarray(sg[..., :half]), jnp.asarray(sg[..., half:]))
        one = None
        for config in CONFIGS:
            kw: dict = {}
            gu, sgu = jnp.asarray(qg), jnp.asarray(sg)
            if config != "1dev":
                layout, scheme = config.split(":")
                ep, tp = (8, 1) if layout == "ep8" else (4, 2)
                mesh = jax.sharding.Mesh(np.array(jax.devices()[: ep * tp]).reshape(ep, tp), ("expert", "tensor"))
                kw = dict(mesh=mesh, expert_axis="expert", tensor_axis="tensor" if tp > 1 else None,
                          dispatch=None if scheme == "fused" else scheme)
                if tp > 1 and scheme != "fused":
                    gu, sgu = pair, pair_s  # the storage a tensor split wants; "fused" splits on every call
            f = lambda xx, gu=gu, sgu=sgu, kw=kw, qd=qd, sd=sd: rd.moe_experts(
                xx, jnp.asarray(ids), jnp.asarray(w), gu, jnp.asarray(qd), w_gate_up_scale=sgu,
                w_down_scale=jnp.asarray(sd), **kw)
            out = np.asarray(f(jnp.asarray(x)), np.float64)
            grad = np.asarray(jax.grad(lambda xx, f=f: jnp.sum(f(xx) * jnp.asarray(dout)))(jnp.asarray(x)), np.float64)
            if one is None:
                one = (out, grad)
            scale = max(np.abs(ref).max(), 1e-6)
            rows.append({"format": fmt, "config": config,
                         "fwd_error": float(np.abs(out - ref).max() / scale) if np.isfinite(out).all() else None,
                         "vs_1dev": float(np.abs(out - one[0]).max() / scale),
                         "grad_vs_1dev": float(np.abs(grad - one[1]).max() / max(np.abs(one[1]).max(), 1e-6)),
                         "grad_nonzero": bool(np.abs(grad).max() > 0)})
    return {"devices": len(jax.devices()), "rows": rows}


if __name__ == "__main__":
    print(json.dumps(main()))
