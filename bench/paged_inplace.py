"""The ragged paged attention's cache update, seen by the real TPU compiler: with both caches donated
(`jax.jit(step, donate_argnums=(3, 4))` around `ragged_paged_attention(..., implementation="pallas")`), libtpu's
memory analysis for a mock v5e / v6e / v7x gives the program's argument, output, aliased and temporary bytes. In place
means: the outputs alias both caches (alias = both caches) and the temporaries stay under a tenth of one cache.

    python bench/paged_inplace.py [--json] [--generations v5e,v6e,v7x] [--cases model|small|fp8|small_fp8|all]

Cases: Qwen3-30B-A3B decode (64 sequences x 8192 positions, pages of 128, 32/4 heads x 128, bf16, two 512 MiB caches)
and Gemma 4 26B-A4B's sliding layers (16/8 x 256, window 1024, two 2 GiB caches), each also as a mixed batch of 2044
new tokens over the 64 sequences: "model"; a small decode and a small mixed one that compile in seconds
(tests/tpu/test_paged_inplace_tpu.py): "small"; Qwen3's decode with bf16 and with float8_e4m3fn caches
(two 256 MiB caches; v5e refuses fp8, and that refusal is its row) and Gemma 4's sliding decode with fp8: "fp8"; the
small case with fp8 caches (tests/tpu/test_paged_fp8_tpu.py): "small_fp8". The compiles run in the TPU environment
(make setup-tpu), in a subprocess of it.
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

#: name: (sequences, positions each, page size, q heads, kv heads, head dim, sliding window[, new tokens]); new tokens
#: default to one a sequence (a decode step); more make a mixed batch (the mixed schedule: its attention call stores
#: the decode steps' rows, the write kernel the rest, both with the caches aliased).
CASES = {
    "qwen3_30b_a3b_decode_b64_8k": (64, 8192, 128, 32, 4, 128, None),
    "gemma4_26b_a4b_sliding_decode_b64_8k": (64, 8192, 128, 16, 8, 256, 1024),
    "qwen3_30b_a3b_mixed_2044_8k": (64, 8192, 128, 32, 4, 128, None, 2044),
    "gemma4_26b_a4b_sliding_mixed_2044_8k": (64, 8192, 128, 16, 8, 256, 1024, 2044),
    "small_decode_b8_2k_window": (8, 2048, 128, 8, 4, 128, 512),
    "small_mixed_b8_2k_window": (8, 2048, 128, 8, 4, 128, 512, 64),
    "small_decode_b8_2k_window_out_proj": (8, 2048, 128, 8, 4, 128, 512),
    "qwen3_30b_a3b_decode_b64_8k_fp8": (64, 8192, 128, 32, 4, 128, None),
    "small_decode_b8_2k_window_fp8": (8, 2048, 128, 8, 4, 128, 512),
    "gemma4_26b_a4b_sliding_decode_b64_8k_fp8": (64, 8192, 128, 16, 8, 256, 1024),
}
#: Cases whose caches are float8_e4m3fn (per-cache scales; v6e and v7x only: v5e refuses fp8 caches); others bf16.
FP8_CASES = {"qwen3_30b_a3b_decode_b64_8k_fp8", "small_decode_b8_2k_window_fp8",
             "gemma4_26b_a4b_sliding_decode_b64_8k_fp8"}
#: Cases whose call takes the output projection (out_proj=, [heads x D, 512]): the decode kernel multiplies by it.
OUT_PROJ_CASES = {"small_decode_b8_2k_window_out_proj"}
GROUPS = {"model": [n for n in CASES if not n.startswith("small") and n not in FP8_CASES],
          "small": ["small_decode_b8_2k_window", "small_mixed_b8_2k_window", "small_decode_b8_2k_window_out_proj"],
          "small_fp8": ["small_decode_b8_2k_window_fp8"],
          "fp8": ["qwen3_30b_a3b_decode_b64_8k", "qwen3_30b_a3b_decode_b64_8k_fp8",
                  "gemma4_26b_a4b_sliding_decode_b64_8k_fp8"]}
GROUPS["all"] = GROUPS["model"] + GROUPS["small"] + sorted(FP8_CASES)


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
            seqs, length, page, hq, hkv, d, window, *more = CASES[name]
            tokens = more[0] if more else seqs
            pages = seqs * (length // page)
            kv_dtype = jnp.float8_e4m3fn if name in FP8_CASES else jnp.bfloat16
            cache = sds((pages, page, hkv, d), kv_dtype)
            scales = {"k_scale": 0.5, "v_scale": 0.5} if name in FP8_CASES else {}
            args = on_device((sds((tokens, hq, d), jnp.bfloat16), sds((tokens, hkv, d), jnp.bfloat16),
                              sds((tokens, hkv, d), jnp.bfloat16), cache, cache, sds((seqs,), jnp.int32),
                              sds((seqs, length // page), jnp.int32), sds((seqs + 1,), jnp.int32),
                              sds((), jnp.int32)), device)
            if name in OUT_PROJ_CASES:  # one more argument, after the nine of the call
                args = (*args, *on_device((sds((hq * d, 512), jnp.bfloat16),), device))

            def step(*a, window=window, scales=scales):
                extra = {"out_proj": a[9]} if len(a) > 9 else {}
                return fa.ragged_paged_attention(*a[:9], sliding_window=window, implementation="pallas",
                                                 interpret=False, **scales, **extra)

            start = time.perf_counter()
            row = {"generation": gen, "case": name,
                   "cache_mib": pages * page * hkv * d * jnp.dtype(kv_dtype).itemsize / MIB}
            try:
                mem = jax.jit(step, donate_argnums=(3, 4)).lower(*args).compile().memory_analysis()
                row.update(compiled="yes", argument_mib=mem.argument_size_in_bytes / MIB,
                           output_mib=mem.output_size_in_bytes / MIB, alias_mib=mem.alias_size_in_bytes / MIB,
                           temp_mib=mem.temp_size_in_bytes / MIB)
            except Exception as exc:  # the compiler's (or the entry's) refusal is the row
                row.update(compiled=str(exc).strip().splitlines()[0][:300])
            row["compile_s"] = round(time.perf_counter() - start, 1)
            print(json.dumps(row), flush=True)


def table(rows: list[dict]) -> str:
    lines = ["generation | case | argument / output / alias / temp MiB | one cache MiB | in place"]
    for r in rows:
        if r["compiled"] != "yes":
            lines.append(f"{r['generation']} | {r['case']} | not compiled: {r['compiled']}")
            continue
        ok = r["alias_mib"] >= 2 * r["cache_mib"] and r["temp_mib"] < r["cache_mib"] / 10
        lines.append(f"{r['generation']} | {r['case']} | {r['argument_mib']:.1f} / {r['output_mib']:.1f} / "
                     f"{r['alias_mib']:.1f} / {r['temp_mib']:.2f} | {r['cache_mib']:.0f} | {'yes' if ok else 'NO'}")
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
