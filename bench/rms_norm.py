"""RMSNorm: kernel-hub's kernel against transformers' own forward on CPU, and the TPU cost model against its ideal.

    python bench/rms_norm.py [--quick] [--json] [--out PATH]

CPU rows (decode 64 x 2048 and prefill 4096 x 2048, Qwen3-30B-A3B's hidden size, bf16 and f32): transformers'
Qwen3MoeRMSNorm.forward (the baseline) and the kernel's torch-cpu build as kernelize installs it (`rms_norm`, the
matched Llama form), timed round-robin (timing.interleaved_samples, 20 ms idle before each call so torch's spinning
OpenMP workers are asleep); ratio = baseline time / our time, per round, median and quartiles. The JAX entry's
"xla" path (jit, jax-cpu build) is timed on its own afterwards (torch and JAX thread pools contend when mixed).
TPU rows (bf16, forward and backward, v5e and v6e by default): tpu_cost_model.schedule.kernel_cost of the
Pallas kernels' grids (max(HBM bytes / bandwidth, MXU FLOPs / peak) + steps x 0.35 us) against the ideal: the bytes each
pass must move once (forward: x and weight in, y out; backward, the custom VJP's kernel alone: x, weight, dy in, dx and
the f32 dw out) at HBM bandwidth.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SHAPES = {"decode": (64, 2048), "prefill": (4096, 2048)}
KERNEL = ROOT / "kernels" / "pallas" / "rms_norm"


def cpu_rows(repeats: int, dtypes: list[str]) -> list[dict]:
    import torch
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRMSNorm

    import kernel_hub as kh
    from kernel_hub.verify.numerics import relative_error
    from kernel_hub.verify.timing import Ratio, Spread, interleaved_samples

    tk = kh.get_local_kernel(KERNEL, framework="torch", backend="cpu")
    rows = []
    for phase, (t, h) in SHAPES.items():
        for name in dtypes:
            dtype = getattr(torch, name)
            g = torch.Generator().manual_seed(0)
            norm = Qwen3MoeRMSNorm(h, eps=1e-6).to(dtype)
            with torch.no_grad():
                norm.weight.copy_(torch.randn(h, generator=g) * 0.5 + 1)
            x = torch.randn(t, h, generator=g).to(dtype)
            with torch.no_grad():
                base = lambda norm=norm, x=x: norm(x)
                ours = lambda norm=norm, x=x: tk.rms_norm(x, norm.weight, eps=1e-6, scale_after_cast=True)
                err = relative_error(ours(), base())
                samples = interleaved_samples({"transformers": base, "kernel_hub": ours}, repeats=repeats,
                                              warmup=2, gap_s=0.02)
            rows.append({"phase": phase, "shape": [t, h], "dtype": name, "max_error": err,
                         "transformers": asdict(Spread.of(samples["transformers"])),
                         "kernel_hub": asdict(Spread.of(samples["kernel_hub"])),
                         "ratio": Ratio.of(samples["transformers"], samples["kernel_hub"]).to_dict(),
                         "implementation": tk.last_implementation()[1]})
    return rows


def jax_rows(repeats: int, dtypes: list[str]) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import kernel_hub as kh
    from kernel_hub.verify.timing import Spread, interleaved_samples

    jk = kh.get_local_kernel(KERNEL, framework="jax", backend="cpu")
    rows = []
    for phase, (t, h) in SHAPES.items():
        for name in dtypes:
            rng = np.random.default_rng(0)
            x = jnp.asarray(rng.standard_normal((t, h)), name)
            w = jnp.asarray(rng.standard_normal(h) * 0.5 + 1, name)
            fn = jax.jit(lambda a, b: jk.rms_norm(a, b, eps=1e-6, scale_after_cast=True, implementation="xla"))
            samples = interleaved_samples({"xla": lambda fn=fn, x=x, w=w: fn(x, w)}, repeats=repeats, warmup=2)
            rows.append({"phase": phase, "shape": [t, h], "dtype": name, "xla": asdict(Spread.of(samples["xla"]))})
    return rows


def tpu_rows(generations: tuple[str, ...]) -> list[dict]:
    import jax

    import kernel_hub as kh
    from kernel_hub.tpu.chips import chip
    from tpu_cost_model.schedule import kernel_cost

    jk = kh.get_local_kernel(KERNEL, framework="jax", backend="cpu")
    pallas = importlib.import_module(f"{jk.__name__}.pallas_rms")
    config = importlib.import_module(f"{jk.__name__}.config")
    call = lambda x, w: jk.rms_norm(x, w, eps=1e-6, implementation="pallas", interpret=False)
    rows = []
    for phase, (t, h) in SHAPES.items():
        st = pallas.RMSStatic(eps=1e-6, zero_centered=False, scale_after_cast=False,
                              block_rows=config.block_rows(t, h, config.RMSNormConfig()))
        backward = lambda x, w, dy, st=st: pallas.rms_backward(st, x, w, dy)  # the custom VJP's backward alone
        x, w = jax.ShapeDtypeStruct((t, h), "bfloat16"), jax.ShapeDtypeStruct((h,), "bfloat16")
        # ideal: forward x, w in and y out; backward x, w, dy in and dx, dw (f32) out, each once
        for pass_, fn, args, ideal_bytes in (("fwd", call, (x, w), 2 * t * h * 2 + h * 2),
                                             ("bwd", backward, (x, w, x), 3 * t * h * 2 + h * 2 + h * 4)):
            cost = kernel_cost(fn, *args)
            for gen in generations:
                c = chip(gen)
                modeled, ideal = cost.seconds(c), ideal_bytes / c.hbm_bytes_per_s
                rows.append({"phase": phase, "shape": [t, h], "pass": pass_, "chip": gen, "modeled_s": modeled,
                             "ideal_s": ideal, "ratio": modeled / ideal, "steps": cost.steps,
                             "hbm_bytes": cost.hbm_bytes, "ideal_bytes": ideal_bytes})
    return rows


def _ms(s: dict) -> str:
    return f"{s['median'] * 1e3:.3f} ({s['q1'] * 1e3:.3f}-{s['q3'] * 1e3:.3f})"


def table(cpu: list[dict], jx: list[dict], tpu: list[dict]) -> str:
    out = ["CPU: median ms (quartiles); ratio = transformers / kernel-hub per round, median (quartiles)",
           f"{'phase':8} {'shape':>10} {'dtype':9} {'transformers ms':>24} {'kernel-hub ms':>24} {'ratio':>20} "
           f"{'max err':>8}"]
    for r in cpu:
        q = r["ratio"]
        out.append(f"{r['phase']:8} {'x'.join(map(str, r['shape'])):>10} {r['dtype']:9} {_ms(r['transformers']):>24} "
                   f"{_ms(r['kernel_hub']):>24} {q['value']:>8.2f}x ({q['low']:.2f}-{q['high']:.2f}) "
                   f"{r['max_error']:8.1e}")
    out.append("JAX xla path (jit), alone: " + "; ".join(
        f"{r['phase']} {r['dtype']} {_ms(r['xla'])} ms" for r in jx))
    out.append("TPU cost model (bf16): modeled vs ideal (bytes once at HBM bandwidth)")
    out.append(f"{'phase':8} {'pass':4} {'chip':4} {'modeled us':>11} {'ideal us':>9} {'ratio':>6} {'steps':>5} "
               f"{'HBM MiB':>8} {'ideal MiB':>9}")
    for r in tpu:
        out.append(f"{r['phase']:8} {r['pass']:4} {r['chip']:4} {r['modeled_s'] * 1e6:11.2f} {r['ideal_s'] * 1e6:9.2f} "
                   f"{r['ratio']:6.3f} {r['steps']:5d} {r['hbm_bytes'] / 2**20:8.2f} {r['ideal_bytes'] / 2**20:9.2f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 interleaved rounds, bf16 only")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 21; quick 5)")
    parser.add_argument("--generations", default="v5e,v6e", help="TPU generations of the cost model")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "rms_norm.json")
    args = parser.parse_args(argv)
    from kernel_hub.tpu.chips import parse_generations

    repeats = args.repeats or (5 if args.quick else 21)
    dtypes = ["bfloat16"] if args.quick else ["bfloat16", "float32"]
    cpu = cpu_rows(repeats, dtypes)
    jx = jax_rows(repeats, dtypes)
    tpu = tpu_rows(parse_generations(args.generations))
    result = {"benchmark": "rms_norm", "repeats": repeats, "cpu": cpu, "jax_cpu": jx, "tpu_model": tpu}
    print(json.dumps(result, indent=1) if args.json else table(cpu, jx, tpu))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
