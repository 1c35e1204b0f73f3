"""Benchmark the ragged_dot kernel's paths on this machine: ours ("cpu", "pallas" interpreted) against
jax.lax.ragged_dot, tokamax.ragged_dot(implementation="xla") and a per-expert loop.

Everything JAX is jitted and warmed up; runs are interleaved across methods in a rotating order (so drift
from other load hits all alike), each timed call is preceded by an untimed call of the same method (so no
method pays for the previous one's memory traffic: jax.lax.ragged_dot's dense intermediate otherwise costs
the next call ~1.5x), and the median is reported with its interquartile range, and speedups relative to
jax.lax.ragged_dot with theirs ("10.5x faster (9.8-11.2)": timing.RATIO_CONVENTION, lax's time / ours). The JSON
carries every sample and the environment (commit, versions, CPU).

  python bench/ragged_dot.py [--quick] [--shapes NAME,...] [--out bench/out/ragged_dot.json]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from json_out import write_result

import kernel_hub as kh
from kernel_hub.report.environment import environment
from kernel_hub.verify.numerics import relative_error
from kernel_hub.verify.timing import bench_records, format_ratio, interleaved_samples

ROOT = Path(__file__).resolve().parents[1]
#: The kernel package as it is in this checkout (its source plus the shared code it vendors, assembled).
rd = kh.get_local_kernel(ROOT / "kernels" / "pallas" / "ragged_dot")

# name, M, K, N, G, dtypes, methods skipped (too slow on 2 cores: they do G x the work)
SHAPES = [
    ("decode_e128", 512, 256, 512, 128, ("float32", "bfloat16"), ()),
    ("qwen3_30b_a3b_decode", 512, 2048, 768, 128, ("bfloat16",), ("jax.lax.ragged_dot", "tokamax_xla")),
    ("prefill_e8", 2048, 256, 512, 8, ("float32", "bfloat16"), ()),
    ("pallas_small_e8", 128, 256, 256, 8, ("float32",), ()),
]
QUICK_SKIP = {"qwen3_30b_a3b_decode"}
BASELINE = "jax.lax.ragged_dot"
OURS = ("ours_cpu", "ours_pallas_interpret")


def _inputs(m: int, k: int, n: int, g: int, dtype: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    lhs = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32), dt)
    rhs = jnp.asarray(rng.standard_normal((g, k, n), dtype=np.float32) / np.sqrt(k), dt)
    sizes = jnp.asarray(np.bincount(rng.integers(0, g, m), minlength=g), jnp.int32)  # uniform top-k routing
    return lhs, rhs, sizes


def _methods(shape: str, lhs, rhs, sizes) -> dict[str, Callable[[], object]]:
    """name -> zero-argument call returning something to block on."""
    hi = jax.lax.Precision.HIGHEST if lhs.dtype == jnp.float32 else None
    out: dict[str, Callable[[], object]] = {}
    if shape == "pallas_small_e8":
        pallas = jax.jit(lambda a, b, s: rd.ragged_dot(a, b, s, implementation="pallas", interpret=True,
                                                       config=rd.RaggedDotConfig(tm=64, tk=256, tn=256)))
        out["ours_pallas_interpret"] = lambda: pallas(lhs, rhs, sizes)
    ours = jax.jit(lambda a, b, s: rd.ragged_dot(a, b, s, implementation="cpu"))
    out["ours_cpu"] = lambda: ours(lhs, rhs, sizes)
    lax_rd = jax.jit(lambda a, b, s: jax.lax.ragged_dot(a, b, s, precision=hi))
    out[BASELINE] = lambda: lax_rd(lhs, rhs, sizes)
    try:
        import tokamax
        from absl import flags

        if not flags.FLAGS.is_parsed():  # tokamax reads absl flags from sys.argv, which holds ours
            flags.FLAGS([sys.argv[0]])
        tk_rd = jax.jit(lambda a, b, s: tokamax.ragged_dot(a, b, s, precision=hi, implementation="xla"))
        out["tokamax_xla"] = lambda: tk_rd(lhs, rhs, sizes)
    except ImportError:
        pass
    # Per-expert loop in NumPy f32 over the actual group slices (what an eager framework loop does).
    a32, b32 = np.asarray(lhs, np.float32), np.asarray(rhs, np.float32)
    ends = np.cumsum(np.asarray(sizes))

    def per_expert() -> np.ndarray:
        res = np.zeros((a32.shape[0], b32.shape[2]), np.float32)
        start = 0
        for g, end in enumerate(ends):
            if end > start:
                np.matmul(a32[start:end], b32[g], out=res[start:end])
            start = end
        return res

    out["per_expert_loop_numpy"] = per_expert
    return out


def run(quick: bool, shapes: tuple[str, ...] | None = None) -> dict:
    """Time every method on every shape (`shapes`: only those); the JSON the bench writes."""
    reps = 3 if quick else 7
    records, skipped = [], []
    for name, m, k, n, g, dtypes, skip in SHAPES:
        if (quick and name in QUICK_SKIP and not shapes) or (shapes and name not in shapes):
            continue
        for dtype in dtypes[:1] if quick else dtypes:
            lhs, rhs, sizes = _inputs(m, k, n, g, dtype)
            methods = {key: fn for key, fn in _methods(name, lhs, rhs, sizes).items() if key not in skip}
            expected = rd.reference_ragged_dot(lhs, rhs, sizes)
            errors = {}
            for key, fn in methods.items():  # warm up (compile) and check each answer once
                errors[key] = relative_error(jax.block_until_ready(fn()), expected)
            times = interleaved_samples(methods, repeats=reps, warmup=0, settle=True)
            for r in bench_records(times, group=f"{name} {dtype}", baseline=BASELINE, shape=name, m=m, k=k, n=n,
                                   g=g, dtype=dtype):
                records.append({**r, "max_rel_error": errors[r["method"]]})
            skipped += [{"group": f"{name} {dtype}", "method": key, "reason": f"densifies to G={g} x the work on CPU"}
                        for key in skip]
    return {
        "benchmark": "ragged_dot",
        "environment": environment(with_libtpu=False).model_dump(),
        "backend": jax.default_backend(),
        "baseline": BASELINE,
        "ours": list(OURS),
        "settings": {"reps": reps, "quick": quick, "shapes": list(shapes) if shapes else None,
                     "timing": "interleaved, rotated; each timed call preceded by an untimed call of the same method"},
        "records": records,
        "skipped": skipped,
    }


def table(report: dict) -> str:
    lines = [f"{'group':26} {'method':24} {'median ms':>10} {'IQR ms':>17} {'vs lax (quartiles)':>24} {'rel err':>9}"]
    for r in report["records"]:
        iqr = f"{r['q1_ms']:.2f}-{r['q3_ms']:.2f}"
        lines.append(f"{r['group']:26} {r['method']:24} {r['median_ms']:10.2f} {iqr:>17} "
                     f"{format_ratio(r['vs_baseline']):>24} {r['max_rel_error']:9.1e}")
    for r in report["skipped"]:
        lines.append(f"{r['group']:26} {r['method']:24} {'skipped':>10}   ({r['reason']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, one dtype, skip the big shape")
    parser.add_argument("--shapes", help="comma list of shapes to run (default: all); " +
                        ", ".join(s[0] for s in SHAPES))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "ragged_dot.json",
                        help="where to write the JSON results (default: %(default)s)")
    args = parser.parse_args(argv)
    shapes = tuple(x.strip() for x in args.shapes.split(",") if x.strip()) if args.shapes else None
    unknown = set(shapes or ()) - {s[0] for s in SHAPES}
    if unknown:
        parser.error(f"unknown shape(s): {', '.join(sorted(unknown))}")
    report = run(args.quick, shapes)
    print(table(report))
    write_result(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
