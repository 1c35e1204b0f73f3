"""Peak memory of one mixed ragged paged attention call on this machine: one prefill chunk of 1024 tokens beside 255
decode steps (256 sequences x 1024 positions, pages of 16, 8 / 2 heads x 128, bf16), through the torch build's
`ragged_paged_attention` (torch-native page walk) and the JAX entry (its CPU page walk).

Each runs in a fresh process that builds the inputs, makes one small call (imports, first-call set-up), reads its
peak resident size (ru_maxrss), makes the call and reads it again: the difference is the call's peak above what the
process already held (tracemalloc sees neither torch's nor XLA's buffers).

  python bench/paged_memory.py [--seqs 256] [--positions 1024]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FA = ROOT / "kernels" / "pallas" / "flash_attention"
HQ, HKV, D, PAGE = 8, 2, 128, 16


def case(seqs: int, positions: int, prefill: int) -> dict[str, np.ndarray]:
    """Sequence 0 a prefill chunk of `prefill` new tokens, the others one decode step each, all `positions` long."""
    rng = np.random.default_rng(0)
    q_lens = np.array([prefill] + [1] * (seqs - 1), np.int32)
    per_seq = -(-positions // PAGE)
    tokens = int(q_lens.sum())
    normal = lambda *shape: rng.standard_normal(shape, np.float32)
    return {
        "queries": normal(tokens, HQ, D), "keys": normal(tokens, HKV, D), "values": normal(tokens, HKV, D),
        "k_cache": normal(seqs * per_seq, PAGE, HKV, D), "v_cache": normal(seqs * per_seq, PAGE, HKV, D),
        "kv_lens": np.full(seqs, positions, np.int32),
        "page_indices": rng.permutation(seqs * per_seq).reshape(seqs, per_seq).astype(np.int32),
        "cu_q_lens": np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32),
    }


def _child(framework: str, seqs: int, positions: int) -> None:
    import kernel_hub as kh

    order = ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens")
    if framework == "torch":
        import torch

        fa = kh.get_local_kernel(FA, framework="torch", backend="cpu")
        convert = lambda x: torch.from_numpy(x).to(torch.bfloat16) if x.dtype == np.float32 else torch.from_numpy(x)
        run = lambda c: fa.ragged_paged_attention(*(c[k] for k in order), implementation="torch")
    else:
        import jax
        import jax.numpy as jnp

        fa = kh.get_local_kernel(FA, framework="jax", backend="cpu")
        convert = lambda x: jnp.asarray(x, jnp.bfloat16) if x.dtype == np.float32 else x
        run = lambda c: jax.block_until_ready(fa.ragged_paged_attention(*(c[k] for k in order)))
    run({k: convert(v) for k, v in case(4, 64, 16).items()})
    big = case(seqs, positions, positions)
    inputs = {k: convert(v) for k, v in big.items()}
    caches = sum(big[k].nbytes // 2 for k in ("k_cache", "v_cache"))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(inputs)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"path": framework, "peak_above_inputs_mib": round((after - before) / 1024, 1),
                      "queries_mib": round(big["queries"].nbytes / 2 / 2**20, 2), "caches_mib": caches / 2**20}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", type=int, default=256)
    p.add_argument("--positions", type=int, default=1024)
    p.add_argument("--child", choices=("torch", "jax"))
    a = p.parse_args()
    if a.child:
        _child(a.child, a.seqs, a.positions)
        return
    for framework in ("torch", "jax"):
        got = subprocess.run([sys.executable, __file__, "--child", framework, "--seqs", str(a.seqs), "--positions",
                              str(a.positions)], capture_output=True, text=True, check=True)
        print(got.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
