"""moe_experts on quantized expert weights compiled by libtpu for a mock 8-chip TPU slice: Qwen3-30B-A3B, decode 64
tokens, bf16 activations, int8 (per-channel scales) and fp8 (128x128 block scales) weights, expert-parallel over 8
chips and 4x2 (expert x tensor), every scale sharded with its weight (ragged_dot/moe_quant.py). Prints, per
generation, layout and format, whether it compiled and the compiler's per-chip argument and temporary bytes (the
quantized layer's arguments are half the bf16 layer's; no temporary copy of dequantized weights).

    python bench/moe_mesh_quant.py [--generations v5e,v6e]

The compiles run in the TPU environment (make setup-tpu), in a subprocess of it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H, INTER, E, K, T = 2048, 768, 128, 8, 64  # Qwen3-30B-A3B, decode 64
LAYOUTS = {"ep8": (8, 1), "ep4xtp2": (4, 2)}
FORMATS = ("int8", "float8_e4m3fn")


def _scale_shape(fmt: str, g: int, k: int, n: int) -> tuple[int, int, int]:
    return (g, 1, n) if fmt == "int8" else (g, -(-k // 128), -(-n // 128))


def compile_rows(generations: list[str]) -> None:
    """Runs inside the TPU environment: one line per (generation, layout, format)."""
    import importlib

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding

    from kernel_hub.tpu.package import folder_package
    from kernel_hub.tpu.target import tpu_dispatch
    from kernel_hub.tpu.worker_common import load_package
    from tpu_cost_model.mesh_worker import slice_target

    sds = jax.ShapeDtypeStruct
    rd = load_package(folder_package(ROOT / "kernels/pallas/ragged_dot").request())
    mq = importlib.import_module(f"{rd.__name__}.moe_quant")
    for gen in generations:
        with tpu_dispatch(), slice_target(gen) as devices:
            for layout, (e, t) in LAYOUTS.items():
                mesh = Mesh(np.array(devices).reshape(e, t), ("expert", "tensor"))
                ta = "tensor" if t > 1 else None
                scheme = rd.plan_dispatch(T, H, K, E, expert_devices=e, tensor_devices=t)[0]
                specs = rd.partition_specs("expert", ta, scheme)[0]
                for fmt in FORMATS:
                    place = lambda shape, dt, spec, mesh=mesh: sds(shape, dt, sharding=NamedSharding(mesh, spec))
                    down = place((E, INTER, H), fmt, specs[4])
                    gu_shape, sgu_shape = ((E, H, 2 * INTER), _scale_shape(fmt, E, H, 2 * INTER)) if t == 1 else \
                        ((E, H, INTER), _scale_shape(fmt, E, H, INTER))
                    sd_shape = _scale_shape(fmt, E, INTER, H)
                    plain = (sds(sgu_shape, jnp.float32) if t == 1 else (sds(sgu_shape, jnp.float32),) * 2,
                             sds(sd_shape, jnp.float32))
                    s_specs = mq.scale_specs(plain, down, "expert", ta)
                    if t == 1:
                        gu, sgu = place(gu_shape, fmt, specs[3]), place(sgu_shape, jnp.float32, s_specs[0])
                    else:
                        gu = tuple(place(gu_shape, fmt, sp) for sp in specs[3])
                        sgu = tuple(place(sgu_shape, jnp.float32, sp) for sp in s_specs[0])
                    args = (place((T, H), "bfloat16", specs[0]), place((T, K), jnp.int32, specs[1]),
                            place((T, K), jnp.float32, specs[2]), gu, down, sgu,
                            place(sd_shape, jnp.float32, s_specs[1]))
                    fn = lambda x, ids, w, g, d, sg, sd, mesh=mesh, ta=ta: rd.moe_experts(
                        x, ids, w, g, d, w_gate_up_scale=sg, w_down_scale=sd, mesh=mesh, expert_axis="expert",
                        tensor_axis=ta)
                    start = time.perf_counter()
                    try:
                        mem = jax.jit(fn).lower(*args).compile().memory_analysis()
                        print(f"{gen}  {layout:8} {fmt:14} compiled  {time.perf_counter() - start:6.1f} s  "
                              f"args/chip {mem.argument_size_in_bytes / 2**20:7.1f} MiB  "
                              f"temp {mem.temp_size_in_bytes / 2**20:5.1f} MiB", flush=True)
                    except Exception as exc:  # the compiler's refusal is the row
                        print(f"{gen}  {layout:8} {fmt:14} REFUSED  {str(exc).splitlines()[0][:200]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", default="v5e,v6e")
    parser.add_argument("--in-tpu-env", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    gens = [g.strip() for g in args.generations.split(",") if g.strip()]
    if args.in_tpu_env:
        compile_rows(gens)
        return 0
    sys.path.insert(0, str(ROOT / "src"))
    from kernel_hub.tpu.env import tpu_env

    bf16_per_chip = 3 * H * INTER * E * 2 / 8 / 2**20
    print(f"bf16 layer weights per chip: {bf16_per_chip:.1f} MiB (quantized: half, plus scales)")
    done = subprocess.run([str(tpu_env().python), __file__, "--in-tpu-env", "--generations", args.generations],
                          stdout=None, stderr=subprocess.DEVNULL)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
