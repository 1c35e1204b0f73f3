"""Accuracy of ragged paged attention with a float8_e4m3fn KV cache beside a bfloat16 one, against float64 NumPy.

Every case draws float32 queries, keys, values and caches, and its float64 attention of those unrounded inputs is the
reference ("ideal"). The bf16 row runs everything in bfloat16; the fp8 row keeps bf16 queries and stores both caches
in e4m3 with per-cache scales max|x| / 448 (quantized here in NumPy with ml_dtypes). Columns: max |out - ideal| and
the harness's relative error max|out - ideal| / max|ideal| (kernel_hub.verify.numerics), and for fp8 also the error
against the float64 attention of the stored (dequantized) cache: the kernel's own arithmetic, without quantization.

    python bench/paged_fp8.py [--implementation cpu|xla|pallas] [--json]
    python bench/paged_fp8.py --modeled [--generations v5e,v6e,v7x] [--json]

"pallas" runs interpreted on CPU (slow: a minute or so). `--modeled`: ours with an fp8 cache beside ours with a bf16
cache at Qwen3-30B-A3B's decode (64 sequences x 8192, pages of 128, 32/4 x 128, bf16 queries, caches donated), each
read by kernel-hub's TPU cost model (tpu_cost_model.kernel_cost: modeled milliseconds at the constants' point and at
both ends of their band, not measurements), in the TPU environment (make setup-tpu), in a subprocess of it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from tpu_rows import rows_from_tpu_env

import kernel_hub as kh
from kernel_hub.verify.numerics import relative_error

ROOT = Path(__file__).resolve().parents[1]
ARGS = ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")


def scenarios(cases) -> tuple:
    """Pages of 32 (whole fp8 tiles): decode with GQA, a mixed batch with an empty sequence and a window, soft cap with
    sinks (MQA), one sequence holding every page, a long decode (2048 positions)."""
    return (
        cases.PagedScenario("decode_gqa8_4x300", ((1, 300),) * 4, hq=16, hkv=2, d=128, page_size=32,
                            pages_per_seq=10),
        cases.PagedScenario("mixed_window_empty", ((1, 1), (3, 17), (0, 9), (9, 70), (1, 50)), hq=4, hkv=2, d=128,
                            page_size=32, pages_per_seq=3, pad=3, window=24),
        cases.PagedScenario("mqa_softcap_sinks", ((1, 33), (2, 64)), hq=4, hkv=1, d=128, page_size=32, pages_per_seq=2,
                            soft_cap=15.0, sinks=True),
        cases.PagedScenario("one_sequence_every_page", ((5, 125),), hq=8, hkv=2, d=128, page_size=32, pages_per_seq=4,
                            spare_pages=0),
        cases.PagedScenario("decode_long_2k", ((1, 2048),) * 2, hq=8, hkv=1, d=128, page_size=32, pages_per_seq=64),
    )


def _fp8(x: np.ndarray, scale: float) -> jnp.ndarray:
    return jnp.asarray(np.clip(x / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn))


def rows(implementation: str) -> list[dict]:
    fa = kh.get_local_kernel(ROOT / "kernels" / "pallas" / "flash_attention")
    cases = importlib.import_module(f"{fa.__name__}.paged_cases")
    out = []
    for sc in scenarios(cases):
        x = cases.paged_inputs(sc, "float32", seed=0)
        feats = dict(cases.features(sc), sinks=x["sinks"])
        ideal = fa.reference_ragged_paged_attention(*(x[k] for k in ARGS), **feats)[0]
        bf16 = {k: (jnp.asarray(x[k], jnp.bfloat16) if k in ARGS[:5] else x[k]) for k in ARGS}
        got_bf16 = fa.ragged_paged_attention(*(bf16[k] for k in ARGS), implementation=implementation, **feats)[0]
        scales = {n: float(max(np.abs(np.asarray(x[c])).max(), np.abs(np.asarray(x[r])).max())) / 448
                  for n, c, r in (("k_scale", "k_cache", "keys"), ("v_scale", "v_cache", "values"))}
        q8 = dict(bf16, k_cache=_fp8(np.asarray(x["k_cache"]), scales["k_scale"]),
                  v_cache=_fp8(np.asarray(x["v_cache"]), scales["v_scale"]))
        got_fp8 = fa.ragged_paged_attention(*(q8[k] for k in ARGS), implementation=implementation, **feats,
                                            **scales)[0]
        stored = fa.reference_ragged_paged_attention(*(q8[k] for k in ARGS), **feats, **scales)[0]
        for cache, got in (("bfloat16", got_bf16), ("float8_e4m3fn", got_fp8)):
            g = np.asarray(got, np.float64)
            row = {"case": sc.name, "cache": cache, "implementation": implementation,
                   "finite": bool(np.isfinite(g).all()), "max_abs": float(np.abs(g - ideal).max()),
                   "rel": relative_error(g, ideal)}
            if cache == "float8_e4m3fn":
                row.update(rel_vs_stored=relative_error(g, stored), **scales)
            out.append(row)
    return out


def table(rs: list[dict]) -> str:
    lines = ["case | bf16 cache: max abs / rel | fp8 e4m3 cache: max abs / rel | fp8 vs its stored cache: rel"]
    by = {(r["case"], r["cache"]): r for r in rs}
    for name in dict.fromkeys(r["case"] for r in rs):
        b, f = by[(name, "bfloat16")], by[(name, "float8_e4m3fn")]
        lines.append(f"{name} | {b['max_abs']:.4f} / {b['rel']:.4f} | {f['max_abs']:.4f} / {f['rel']:.4f} | "
                     f"{f['rel_vs_stored']:.4f}")
    return "\n".join(lines)


def modeled_rows(generations: list[str]) -> None:
    """Runs inside the TPU environment: one JSON line per (generation, cache dtype)."""
    import jax

    from kernel_hub.tpu.chips import chip
    from kernel_hub.tpu.package import folder_package
    from kernel_hub.tpu.target import topology_devices
    from kernel_hub.tpu.worker_common import first_meaningful_line, load_package
    from tpu_cost_model.paged_peers import CACHE, PAGE, _metadata, batch
    from tpu_cost_model.schedule import kernel_cost

    fa = load_package(folder_package(ROOT / "kernels/pallas/flash_attention").request())
    sds = jax.ShapeDtypeStruct
    hq, hkv, d = 32, 4, 128
    seqs = batch("decode")
    meta, b = _metadata(seqs), len(seqs)
    for gen in generations:
        jax.config.update("jax_default_device", topology_devices(chip(gen).topology)[0])
        for kv in ("bfloat16", "float8_e4m3fn"):
            cache = sds((b * (CACHE // PAGE), PAGE, hkv, d), kv)
            args = (sds((b, hq, d), "bfloat16"), sds((b, hkv, d), "bfloat16"), sds((b, hkv, d), "bfloat16"), cache,
                    cache, meta["kv_lens"], meta["table"], meta["cu"], np.int32(b))
            scales = {"k_scale": 0.5, "v_scale": 0.5} if kv != "bfloat16" else {}
            fn = jax.jit(lambda *a, sc=scales: fa.ragged_paged_attention(*a, implementation="pallas", interpret=False,
                                                                          **sc), donate_argnums=(3, 4))
            row = {"generation": gen, "cache": kv, "case": "qwen3_30b_a3b 32/4x128 decode b64 8k"}
            try:
                cost = kernel_cost(fn, *args, generation=gen)
                fast, slow = cost.band(chip(gen))
                row.update(modeled_ms=cost.seconds(chip(gen)) * 1e3, band_ms=[fast * 1e3, slow * 1e3])
            except Exception as exc:  # the entry's refusal (v5e: no fp8) or the model's is the row
                row["refused"] = first_meaningful_line(str(exc))
            print(json.dumps(row), flush=True)


def modeled_table(rs: list[dict]) -> str:
    lines = ["generation | case | bf16 cache ms (band) | fp8 cache ms (band) | fp8 / bf16  [modeled, not measured]"]
    by = {(r["generation"], r["cache"]): r for r in rs}
    for gen in dict.fromkeys(r["generation"] for r in rs):
        b, f = by[(gen, "bfloat16")], by[(gen, "float8_e4m3fn")]
        cell = lambda r: (f"{r['modeled_ms']:.3f} ({r['band_ms'][0]:.3f}-{r['band_ms'][1]:.3f})" if "modeled_ms" in r
                          else f"refused: {r['refused']}")
        ratio = f"{f['modeled_ms'] / b['modeled_ms']:.2f}" if "modeled_ms" in f and "modeled_ms" in b else "-"
        lines.append(f"{gen} | {b['case']} | {cell(b)} | {cell(f)} | {ratio}")
    return "\n".join(lines)


def _modeled(generations: str, as_json: bool) -> int:
    rs, failed = rows_from_tpu_env(__file__, ["--generations", generations])
    if failed:
        return failed
    print(json.dumps(rs, indent=1) if as_json else modeled_table(rs))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--implementation", default="cpu", choices=["cpu", "xla", "pallas"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--modeled", action="store_true", help="the cost model's fp8 vs bf16 decode rows")
    parser.add_argument("--generations", default="v5e,v6e,v7x")
    parser.add_argument("--in-tpu-env", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    gens = [g.strip() for g in args.generations.split(",") if g.strip()]
    if args.in_tpu_env:
        modeled_rows(gens)
        return 0
    if args.modeled:
        return _modeled(",".join(gens), args.json)
    rs = rows(args.implementation)
    print(json.dumps(rs, indent=1) if args.json else table(rs))
    return 0 if all(r["finite"] for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
