"""HF `kernels` 0.19.1 loading our published kernels in the TPU environment (torch_tpu installed), from the
`kernel-hub serve` that HF_ENDPOINT names. Run by tests/tpu/test_torch_tpu.py:
`python hf_kernels_torch_tpu.py RAGGED_DOT_REPO FLASH_ATTENTION_REPO`; prints one JSON line.

HF kernels 0.19 takes the `tpu` backend when torch's current accelerator is a TPU
(`torch.accelerator.current_accelerator().type == "tpu"`, kernels' backends._backend), which torch_tpu makes so on a
TPU host. torch_tpu 0.2 sets up its device only where it finds TPU hardware (here even `torch.device("tpu")` is
refused), so on a host without one HF kernels picks `cpu` (recorded first); the script then makes torch's current
accelerator answer "tpu", standing in for the TPU host, and loads again.
"""

from __future__ import annotations

import json
import sys
import types
import warnings

import numpy as np
import torch
import torch_tpu  # noqa: F401  (also imported by torch's backend autoload)
from kernels._internals.backends import _backend

from kernels import get_kernel


def ragged_reference(lhs, rhs, sizes):
    out, start = np.zeros((lhs.shape[0], rhs.shape[2])), 0
    for g, n in enumerate(sizes):
        out[start:start + n] = lhs[start:start + n] @ rhs[g]
        start += n
    return out


def main(rd_repo: str, fa_repo: str) -> dict:
    facts: dict = {"backend_here": _backend().name}
    facts["file_here"] = get_kernel(rd_repo, version=1, trust_remote_code=True).__file__

    tpu = types.SimpleNamespace(type="tpu")
    torch.accelerator.current_accelerator = lambda *a, **k: tpu  # what HF kernels reads as "a TPU host"
    facts["backend_tpu"] = _backend().name
    rd = get_kernel(rd_repo, version=1, trust_remote_code=True)
    fa = get_kernel(fa_repo, version=1, trust_remote_code=True)
    facts["files"] = [rd.__file__, fa.__file__]
    facts["exports"] = sorted(set(rd.__all__) | set(fa.__all__))
    facts["ops"] = sorted(op._qualname for m in (rd, fa) for op in m.tpu_ops().values())
    meta = torch.empty(300, 256, dtype=torch.bfloat16, device="meta")
    out = rd.tpu_ops()["ragged_dot"](meta, torch.empty(8, 256, 384, dtype=torch.bfloat16, device="meta"),
                                     torch.empty(8, dtype=torch.int32, device="meta"),
                                     preferred_element_type=torch.float32)
    facts["meta_out"] = [list(out.shape), str(out.dtype)]

    g = torch.Generator().manual_seed(0)
    lhs, rhs, sizes = torch.randn(40, 32, generator=g), torch.randn(4, 32, 16, generator=g), [10, 0, 17, 9]
    q, kv = torch.randn(1, 4, 5, 16, generator=g), torch.randn(1, 2, 7, 16, generator=g)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = rd.ragged_dot(lhs, rhs, torch.tensor(sizes, dtype=torch.int32))
        attn = fa.flash_attention(q, kv, kv, causal=True)
    expected = ragged_reference(lhs.double().numpy(), rhs.double().numpy(), sizes)
    facts["cpu_error"] = float(np.abs(got.double().numpy() - expected).max() / np.abs(expected).max())
    facts["cpu_attention_shape"] = list(attn.shape)
    facts["cpu_warnings"] = [str(w.message) for w in seen if "torch-tpu build" in str(w.message)]
    facts["last_implementation"] = list(rd.last_implementation())
    return facts


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
