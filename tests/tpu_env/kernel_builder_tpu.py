"""kernel-hub loading a kernel-builder torch-tpu repo in the TPU environment (torch_tpu installed), from the
`kernel-hub serve` that HF_ENDPOINT names. Run by tests/sources/test_hub_kernel_builder_tpu.py: `python
kernel_builder_tpu.py REPO`; prints one JSON line of facts.

The repo's kernel (tests/kernel_builder_repo.py RAGGED_TPU) registers its JAX functions through torch_tpu's
jax_op at import, as Hugging Face's kernels-community/ragged-dot-tpu does. Here (no TPU): the import, the exports,
the ops traced on meta tensors, the JAX experts forward's numbers on CPU against NumPy, and CPU tensors refused.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

import kernel_hub as kh


def reference(x, idx, w, gate_up, down):
    """NumPy, float64: each token's routed experts, SiLU-gated, weighted; index == E computes nothing."""
    experts, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(idx.shape[1]):
            e = idx[t, k]
            if e >= experts:
                continue
            gate, up = gate_up[e][:inter] @ x[t], gate_up[e][inter:] @ x[t]
            out[t] += w[t, k] * (down[e] @ (gate / (1 + np.exp(-gate)) * up))
    return out


def main(repo: str) -> dict:
    facts: dict = {}
    start = time.perf_counter()
    module = kh.get_kernel(repo, version=1, framework="torch", backend="tpu", trust_remote_code=True)
    facts["load_seconds"] = time.perf_counter() - start
    info = module.__kernel_hub__
    facts.update(variant=info.variant, verified=info.verified, exports=sorted(module.__all__),
                 ops=sorted(str(op._qualname) for op in (module._ragged_op, module._experts_op)))

    layer = type("Experts", (), {})()
    layer.gate_up_proj = torch.empty(8, 2 * 64, 128, dtype=torch.bfloat16, device="meta")
    layer.down_proj = torch.empty(8, 128, 64, dtype=torch.bfloat16, device="meta")
    out = module.experts_forward(layer, torch.empty(32, 128, dtype=torch.bfloat16, device="meta"),
                                 torch.empty(32, 2, dtype=torch.int64, device="meta"),
                                 torch.empty(32, 2, dtype=torch.bfloat16, device="meta"))
    facts["meta_experts"] = [list(out.shape), str(out.dtype)]
    rd = module.ragged_dot(torch.empty(40, 32, device="meta"), torch.empty(4, 32, 16, device="meta"),
                           torch.empty(4, dtype=torch.int32, device="meta"))
    facts["meta_ragged_dot"] = list(rd.shape)

    rng = np.random.default_rng(0)
    x, gate_up, down = rng.standard_normal((12, 16)), rng.standard_normal((4, 2 * 8, 16)), rng.standard_normal(
        (4, 16, 8))
    idx = rng.integers(0, 5, size=(12, 2))  # 4 == E: the expert-parallel sentinel
    w = rng.random((12, 2))
    got = np.asarray(module.experts_jax(*(a.astype(np.float32) for a in (x,)), idx.astype(np.int32),
                                        w.astype(np.float32), gate_up.astype(np.float32), down.astype(np.float32)))
    want = reference(x, idx, w, gate_up, down)
    facts["experts_error"] = float(np.abs(got - want).max() / np.abs(want).max())
    facts["sentinel_rows"] = int((idx == 4).sum())
    try:
        module.ragged_dot(torch.ones(4, 2), torch.ones(1, 2, 3), torch.tensor([4], dtype=torch.int32))
        facts["cpu_tensors"] = "ran"
    except Exception as exc:  # whatever torch_tpu raises is the fact
        facts["cpu_tensors"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return facts


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
    sys.stdout.flush()
