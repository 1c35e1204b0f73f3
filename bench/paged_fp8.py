"""Accuracy of ragged paged attention with a float8_e4m3fn KV cache beside a bfloat16 one, against float64 NumPy.

Every case draws float32 queries, keys, values and caches, and its float64 attention of those unrounded inputs is the
reference ("ideal"). The bf16 row runs everything in bfloat16; the fp8 row keeps bf16 queries and stores both caches
in e4m3 with per-cache scales max|x| / 448 (quantized here in NumPy with ml_dtypes). Columns: max |out - ideal| and
the harness's relative error max|out - ideal| / max|ideal| (kernel_hub.verify.numerics), and for fp8 also the error
against the float64 attention of the stored (dequantized) cache: the kernel's own arithmetic, without quantization.

    python bench/paged_fp8.py [--implementation cpu|xla|pallas] [--json]

"pallas" runs interpreted on CPU (slow: a minute or so).
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

import kernel_hub as kh
from kernel_hub.verify.numerics import relative_error

ROOT = Path(__file__).resolve().parents[1]
fa = kh.get_local_kernel(ROOT / "kernels" / "pallas" / "flash_attention")
cases = importlib.import_module(f"{fa.__name__}.paged_cases")
ARGS = ("queries", "keys", "values", "k_cache", "v_cache", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")

#: Pages of 32 (whole fp8 tiles): decode with GQA, a mixed batch with an empty sequence and a window, soft cap with
#: sinks (MQA), one sequence holding every page, a long decode (2048 positions).
SCENARIOS = (
    cases.PagedScenario("decode_gqa8_4x300", ((1, 300),) * 4, hq=16, hkv=2, d=128, page_size=32, pages_per_seq=10),
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
    out = []
    for sc in SCENARIOS:
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
            row = {"case": sc.name, "cache": cache, "implementation": implementation, "finite": bool(np.isfinite(g).all()),
                   "max_abs": float(np.abs(g - ideal).max()), "rel": relative_error(g, ideal)}
            if cache == "float8_e4m3fn":
                row.update(rel_vs_stored=relative_error(g, stored), **scales)
            out.append(row)
    return out


def table(rs: list[dict]) -> str:
    lines = ["case | bf16 cache: max abs / rel | fp8 e4m3 cache: max abs / rel | fp8 vs its stored cache: rel"]
    by = {(r["case"], r["cache"]): r for r in rs}
    for sc in SCENARIOS:
        b, f = by[(sc.name, "bfloat16")], by[(sc.name, "float8_e4m3fn")]
        lines.append(f"{sc.name} | {b['max_abs']:.4f} / {b['rel']:.4f} | {f['max_abs']:.4f} / {f['rel']:.4f} | "
                     f"{f['rel_vs_stored']:.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--implementation", default="cpu", choices=["cpu", "xla", "pallas"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rs = rows(args.implementation)
    print(json.dumps(rs, indent=1) if args.json else table(rs))
    return 0 if all(r["finite"] for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
