"""Ragged paged attention on KV caches stacked over layers, seen by the real TPU compiler: a decode step's
`lax.scan` over the layers carries both [L, pages, page_size, Hkv, D] stacks and calls
`ragged_paged_attention(..., layer=i, implementation="pallas")` each layer, under
`jax.jit(step, donate_argnums=(0, 1))`.
libtpu's memory analysis for a mock v5e / v6e / v7x gives the program's argument, output, aliased and temporary
bytes. In place means: the outputs alias both stacks (alias >= both stacks) and the temporaries stay under a tenth of
one layer's cache (no layer is ever sliced out of a stack or written back).

    python bench/paged_stacked.py [--json] [--generations v5e,v6e,v7x] [--cases model|fp8|small|all]

Cases: Qwen3-30B-A3B decode, 4 layers (64 sequences x 8192 positions, pages of 128, 32/4 heads x 128; one layer's
cache 512 MiB in bf16, a stack 2 GiB): "model"; the same with float8_e4m3fn stacks (v6e and v7x; v5e refuses fp8
caches, and that refusal is its row): "fp8"; 8 sequences x 2048 positions at 8/4 heads x 128 with a 512 window,
a shape with no tuned entry whose fallback blocks compile in seconds: "small" (tests/tpu/test_paged_stacked_tpu.py).
The compiles run in the TPU environment (make setup-tpu), in a subprocess of it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tpu_rows import rows_from_tpu_env

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20

#: name: (layers, sequences, positions each, page size, q heads, kv heads, head dim, cache dtype, window or None)
CASES = {
    "qwen3_30b_a3b_decode_b64_8k_4_layers": (4, 64, 8192, 128, 32, 4, 128, "bfloat16", None),
    "qwen3_30b_a3b_decode_b64_8k_4_layers_fp8": (4, 64, 8192, 128, 32, 4, 128, "float8_e4m3fn", None),
    "small_decode_b8_2k_4_layers": (4, 8, 2048, 128, 8, 4, 128, "bfloat16", 512),
}
GROUPS = {"model": ["qwen3_30b_a3b_decode_b64_8k_4_layers"], "fp8": ["qwen3_30b_a3b_decode_b64_8k_4_layers_fp8"],
          "small": ["small_decode_b8_2k_4_layers"]}
GROUPS["all"] = GROUPS["model"] + GROUPS["fp8"]


def compile_rows(generations: list[str], names: list[str]) -> None:
    """Runs inside the TPU environment: one JSON line per (generation, case)."""
    import jax
    import jax.numpy as jnp

    from kernel_hub.tpu.chips import chip
    from kernel_hub.tpu.package import folder_package
    from kernel_hub.tpu.target import on_device, topology_devices
    from kernel_hub.tpu.worker_common import load_package

    fa = load_package(folder_package(ROOT / "kernels/pallas/flash_attention").request())
    sds = jax.ShapeDtypeStruct
    for gen in generations:
        device = topology_devices(chip(gen).topology)[0]
        jax.config.update("jax_default_device", device)
        for name in names:
            layers, seqs, length, page, hq, hkv, d, kv_dtype, window = CASES[name]
            pages = seqs * (length // page)
            stack = sds((layers, pages, page, hkv, d), kv_dtype)
            scales = {"k_scale": 0.5, "v_scale": 0.5} if kv_dtype == "float8_e4m3fn" else {}
            args = on_device((stack, stack, sds((layers, seqs, hq, d), jnp.bfloat16),
                              sds((layers, seqs, hkv, d), jnp.bfloat16), sds((layers, seqs, hkv, d), jnp.bfloat16),
                              sds((seqs,), jnp.int32), sds((seqs, length // page), jnp.int32),
                              sds((seqs + 1,), jnp.int32), sds((), jnp.int32)), device)

            def step(k_stack, v_stack, q, k, v, *meta, layers=layers, scales=scales, window=window):
                def body(caches, xs):
                    i, q_i, k_i, v_i = xs
                    out, k_s, v_s = fa.ragged_paged_attention(q_i, k_i, v_i, *caches, *meta, layer=i,
                                                              sliding_window=window, implementation="pallas",
                                                              interpret=False, **scales)
                    return (k_s, v_s), out

                (k_stack, v_stack), outs = jax.lax.scan(body, (k_stack, v_stack), (jnp.arange(layers), q, k, v))
                return outs, k_stack, v_stack

            start = time.perf_counter()
            itemsize = jnp.dtype(kv_dtype).itemsize
            row = {"generation": gen, "case": name, "layers": layers,
                   "cache_mib": pages * page * hkv * d * itemsize / MIB,
                   "stack_mib": layers * pages * page * hkv * d * itemsize / MIB}
            try:
                mem = jax.jit(step, donate_argnums=(0, 1)).lower(*args).compile().memory_analysis()
                row.update(compiled="yes", argument_mib=mem.argument_size_in_bytes / MIB,
                           output_mib=mem.output_size_in_bytes / MIB, alias_mib=mem.alias_size_in_bytes / MIB,
                           temp_mib=mem.temp_size_in_bytes / MIB)
            except Exception as exc:  # the compiler's (or the entry's) refusal is the row
                row.update(compiled=str(exc).strip().splitlines()[0][:300])
            row["compile_s"] = round(time.perf_counter() - start, 1)
            print(json.dumps(row), flush=True)


def in_place(row: dict) -> bool:
    """Both stacks are the outputs' buffers and nothing the size of a layer's cache is a temporary."""
    return row["alias_mib"] >= 2 * row["stack_mib"] and row["temp_mib"] < row["cache_mib"] / 10


def table(rows: list[dict]) -> str:
    lines = ["generation | case | argument / output / alias / temp MiB | one layer's cache / stack MiB | in place"]
    for r in rows:
        if r["compiled"] != "yes":
            lines.append(f"{r['generation']} | {r['case']} | not compiled: {r['compiled']}")
            continue
        lines.append(f"{r['generation']} | {r['case']} | {r['argument_mib']:.1f} / {r['output_mib']:.1f} / "
                     f"{r['alias_mib']:.1f} / {r['temp_mib']:.2f} | {r['cache_mib']:.0f} / {r['stack_mib']:.0f} | "
                     f"{'yes' if in_place(r) else 'NO'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--generations", default="v5e,v6e,v7x")
    parser.add_argument("--cases", default="model", choices=sorted(GROUPS))
    parser.add_argument("--in-tpu-env", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    gens = [g.strip() for g in args.generations.split(",") if g.strip()]
    if args.in_tpu_env:
        compile_rows(gens, GROUPS[args.cases])
        return 0
    rows, failed = rows_from_tpu_env(__file__, ["--generations", args.generations, "--cases", args.cases])
    if failed:
        return failed
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
