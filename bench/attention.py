"""Benchmark the flash_attention kernel's paths on this machine: ours ("cpu", "xla", the "pallas" kernel
interpreted on a small shape) against jax.nn.dot_product_attention, tokamax.dot_product_attention
(implementations "xla" and "xla_chunked", the ones that run on CPU) and torch's scaled_dot_product_attention.

Every JAX callable is jitted and warmed up; layouts are converted before timing (BTNH for jax.nn/tokamax,
BHSD for ours and torch); runs are interleaved across methods so drift from other load hits all alike,
and medians are reported with their interquartile range and the ratio to jax.nn.dot_product_attention (>1:
faster than it) with the quartiles of the per-round ratios. The JSON carries every sample and the environment.
Note: torch and XLA share the cores; a torch call right after a JAX call can run slower.

  python bench/attention.py [--quick] [--repeats N] [--out bench/out/attention.json]
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
from kernel_hub.verify.numerics import relative_error, tolerance
from kernel_hub.verify.timing import bench_records, format_ratio, interleaved_samples

ROOT = Path(__file__).resolve().parents[1]
#: The kernel package as it is in this checkout (its source plus the shared code it vendors, assembled).
fa = kh.get_local_kernel(ROOT / "kernels" / "pallas" / "flash_attention")

BASELINE = "jax.nn"
OURS = ("ours_cpu", "ours_xla", "ours_pallas_interpret")


# name, kind, B, Hq, Hkv, Sq (1 for decode), S, D, dtypes, quick?
SHAPES = [
    ("prefill_causal_gqa_s1024", "prefill", 1, 8, 2, 1024, 1024, 128, ("float32", "bfloat16"), False),
    ("prefill_causal_gqa_s512", "prefill", 1, 8, 2, 512, 512, 128, ("float32",), True),
    ("decode_b64_gptoss_s1024", "decode", 64, 64, 8, 1, 1024, 64, ("bfloat16",), False),
    ("decode_b16_gptoss_s1024", "decode", 16, 64, 8, 1, 1024, 64, ("bfloat16",), True),
    ("pallas_small_s256", "prefill", 1, 2, 1, 256, 256, 64, ("float32",), True),
]


def _inputs(kind: str, b: int, hq: int, hkv: int, sq: int, s: int, d: int, dtype: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    q_shape = (b, hq, d) if kind == "decode" else (b, hq, sq, d)
    q = jnp.asarray(rng.standard_normal(q_shape, dtype=np.float32), dt)
    k = jnp.asarray(rng.standard_normal((b, hkv, s, d), dtype=np.float32), dt)
    v = jnp.asarray(rng.standard_normal((b, hkv, s, d), dtype=np.float32), dt)
    lens = jnp.asarray(rng.integers(s // 4, s + 1, size=b), jnp.int32)  # ragged cache occupancy
    return q, k, v, lens


def _torch_methods(kind: str, q, k, v, lens) -> dict[str, Callable[[], object]]:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return {}
    torch.set_num_threads(2)
    tdt = torch.bfloat16 if q.dtype == jnp.bfloat16 else torch.float32
    conv = lambda x: torch.from_numpy(np.asarray(x.astype(jnp.float32))).to(tdt)
    tq, tk, tv = conv(q), conv(k), conv(v)
    if kind == "prefill":
        return {"torch_sdpa": lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)}
    mask = torch.arange(k.shape[2])[None, None, None, :] < torch.from_numpy(np.asarray(lens))[:, None, None, None]
    tq4 = tq[:, :, None, :]
    return {"torch_sdpa": lambda: F.scaled_dot_product_attention(tq4, tk, tv, attn_mask=mask, enable_gqa=True)}


def _methods(name: str, kind: str, q, k, v, lens) -> dict[str, Callable[[], object]]:
    """method -> zero-argument call returning something to block on."""
    out: dict[str, Callable[[], object]] = {}
    hi = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    if kind == "prefill":
        if name.startswith("pallas_small"):
            pallas = jax.jit(lambda q, k, v: fa.flash_attention(q, k, v, causal=True, implementation="pallas",
                                                                interpret=True))
            out["ours_pallas_interpret"] = lambda: pallas(q, k, v)
        for impl in ("cpu", "xla"):
            f = jax.jit(lambda q, k, v, impl=impl: fa.flash_attention(q, k, v, causal=True, implementation=impl))
            out[f"ours_{impl}"] = lambda f=f: f(q, k, v)
        qt, kt, vt = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # BTNH
        jnn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))
        out[BASELINE] = lambda: jnn(qt, kt, vt)
        try:
            import tokamax

            for impl in ("xla", "xla_chunked"):
                tk_fn = jax.jit(lambda q, k, v, impl=impl: tokamax.dot_product_attention(
                    q, k, v, is_causal=True, precision=hi, implementation=impl))
                out[f"tokamax_{impl}"] = lambda tk_fn=tk_fn: tk_fn(qt, kt, vt)
        except ImportError:
            pass
    else:
        ours = jax.jit(lambda q, k, v, lens: fa.decode_attention(q, k, v, lens, implementation="cpu"))
        out["ours_cpu"] = lambda: ours(q, k, v, lens)
        qt = q[:, None]  # [B, 1, Hq, D]
        kt, vt = (jnp.swapaxes(x, 1, 2) for x in (k, v))
        jnn = jax.jit(lambda q, k, v, lens: jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lens))
        out[BASELINE] = lambda: jnn(qt, kt, vt, lens)
        try:
            import tokamax

            tk_fn = jax.jit(lambda q, k, v, lens: tokamax.dot_product_attention(
                q, k, v, key_value_seq_lengths=lens, precision=hi, implementation="xla"))
            out["tokamax_xla"] = lambda: tk_fn(qt, kt, vt, lens)
        except ImportError:
            pass
    out.update(_torch_methods(kind, q, k, v, lens))
    return out


def _check(name: str, kind: str, dtype: str, methods: dict[str, Callable[[], object]]) -> None:
    """Every method must agree with ours before its time counts (catches a layout slip in the bench)."""
    ref = np.asarray(methods["ours_cpu"]()).astype(np.float32)
    for method, fn in methods.items():
        got = fn()
        got = got.float().numpy() if hasattr(got, "float") else np.asarray(got).astype(np.float32)
        if got.shape != ref.shape:
            got = np.swapaxes(got, 1, 2) if kind == "prefill" else got.reshape(ref.shape)
        err = relative_error(got, ref)
        if not err <= tolerance(dtype):
            raise SystemExit(f"{name}: {method} disagrees with ours_cpu (relative error {err:.2e})")


def run(quick: bool, repeats: int | None = None) -> dict:
    """Check and time every method on every shape; the JSON the bench writes."""
    repeats = repeats or (3 if quick else 7)
    try:  # tokamax reads absl flags from sys.argv on first use and rejects ours: parse an empty command line
        from absl import flags

        flags.FLAGS(sys.argv[:1], known_only=True)
    except ImportError:
        pass
    records = []
    for name, kind, b, hq, hkv, sq, s, d, dtypes, quick_shape in SHAPES:
        if quick and not quick_shape:
            continue
        for dtype in dtypes:
            q, k, v, lens = _inputs(kind, b, hq, hkv, sq, s, d, dtype)
            methods = _methods(name, kind, q, k, v, lens)
            _check(name, kind, dtype, methods)
            samples = interleaved_samples(methods, repeats=repeats, warmup=1)
            records += bench_records(samples, group=f"{name} {dtype}", baseline=BASELINE, shape=name, kind=kind,
                                     dtype=dtype, dims=dict(B=b, Hq=hq, Hkv=hkv, Sq=sq, S=s, D=d))
    return dict(benchmark="attention", environment=environment(with_libtpu=False).model_dump(),
                backend=jax.default_backend(), baseline=BASELINE, ours=list(OURS),
                settings=dict(repeats=repeats, quick=quick), records=records)


def table(report: dict) -> str:
    rows = [("group", "method", "median ms", "IQR ms", f"vs {BASELINE} (quartiles)")]
    rows += [(r["group"], r["method"], f"{r['median_ms']:.2f}", f"{r['q1_ms']:.2f}-{r['q3_ms']:.2f}",
              format_ratio(r["vs_baseline"])) for r in report["records"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes only, fewer repeats (~1 minute)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per method (default 7, quick 3)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "attention.json", help="JSON output")
    args = parser.parse_args(argv)
    report = run(args.quick, args.repeats)
    print(table(report))
    write_result(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
