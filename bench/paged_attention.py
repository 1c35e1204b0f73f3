"""Ragged paged attention on this machine: our page-walking CPU path against the gather-then-attend baseline (every
page of every sequence gathered into a contiguous copy, then attention: the "xla" implementation), side by side,
on a decode batch and a mixed prefill + decode batch; plus each path's peak temporary memory from XLA's own memory
analysis of the compiled call, beside the size of one cache.

Runs are interleaved (kernel_hub.verify.timing); medians with their interquartile range, ratio vs the baseline (>1: ours
faster) with the quartiles of the per-round ratios. Outputs are checked against each other before timing.

  python bench/paged_attention.py [--repeats N] [--out bench/out/paged_attention.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import kernel_hub as kh
from kernel_hub.report.environment import environment
from kernel_hub.verify.numerics import relative_error, tolerance
from kernel_hub.verify.timing import bench_records, format_ratio, interleaved_samples

ROOT = Path(__file__).resolve().parents[1]
fa = kh.get_local_kernel(ROOT / "kernels" / "pallas" / "flash_attention")
ARGS = ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")

#: name, sequences as (new tokens, length), q heads, kv heads, head dim, page size, pages per sequence
SHAPES = [
    ("decode 32 x 2048, 16/2 x 128", [(1, 2048)] * 32, 16, 2, 128, 16, 128),
    ("mixed 2 x 256 prefill + 30 decode x 1024, 16/2 x 128", [(256, 512)] * 2 + [(1, 1024)] * 30, 16, 2, 128, 16,
     64),
]


def main(argv: list[str] | None = None) -> int:
    cases = importlib.import_module(f"{fa.__name__}.paged_cases")  # the loaded package's own scenario helpers
    PagedScenario, paged_inputs = cases.PagedScenario, cases.paged_inputs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    records, lines = [], []
    for name, seqs, hq, hkv, d, page, pps in SHAPES:
        sc = PagedScenario(name, tuple(seqs), hq, hkv, d, page, pps, spare_pages=0)
        x = paged_inputs(sc, "float32", 0)
        operands = [jnp.asarray(x[k]) for k in ARGS]
        fns, memory = {}, {}
        for impl in ("cpu", "xla"):
            jitted = jax.jit(lambda *a, i=impl: fa.ragged_paged_attention(*a, implementation=i))
            memory[impl] = jitted.lower(*operands).compile().memory_analysis().temp_size_in_bytes
            fns[f"ours_{impl}" if impl == "cpu" else "gather_then_attend"] = (
                lambda f=jitted, a=operands: jax.block_until_ready(f(*a)))
        outs = [np.asarray(f()[0]) for f in fns.values()]
        err = relative_error(outs[0], outs[1])
        if err > tolerance("float32"):
            raise SystemExit(f"{name}: the two paths disagree ({err:.2e})")
        samples = interleaved_samples(fns, repeats=args.repeats, settle=True)
        recs = bench_records(samples, group=name, baseline="gather_then_attend",
                             cache_bytes=int(np.asarray(x["k_cache"]).nbytes), temp_bytes=memory)
        records += recs
        cache_mib = np.asarray(x["k_cache"]).nbytes / 2**20
        for r in recs:
            impl = "cpu" if r["method"] == "ours_cpu" else "xla"
            lines.append(f"{name:55s} {r['method']:20s} {r['median_ms']:8.2f} ms  "
                         f"{format_ratio(r['vs_baseline']):28s} peak temp {memory[impl] / 2**20:7.1f} MiB "
                         f"(one cache {cache_mib:.1f} MiB)")
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"benchmark": "paged_attention", "environment": environment().model_dump(),
                                        "records": records}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
