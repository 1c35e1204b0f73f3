"""The MoE layer expert-parallel on a mesh: timings on 8 simulated CPU devices, and the TPU v5e-8 / v6e-8 model
and compiled memory.

    python bench/moe_mesh.py [--json] [--skip-tpu] [--generations v5e,v6e] [--repeats 7]

Part 1, simulated devices (a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8): moe_experts on one
device, expert-parallel over 8 devices and over a 4x2 (expert x tensor) mesh, every dispatch scheme, at a scaled-down
geometry (decode 64 tokens and prefill 1024, f32, the "cpu" ragged dot). Medians of interleaved runs with their
spread (verify.timing). Honest caveat: the 8 "devices" are threads of one process sharing this machine's cores,
so the collectives cost memcpys and the 8 shards compete for the same 2 cores: these numbers rank the schemes'
local work and glue, not a TPU slice's time.

Part 2, TPU (tpu_cost_model.mesh, in the TPU environment): each layer compiled by libtpu for a mock
8-chip slice (per-chip memory from the compiler; the whole model's MoE layers against HBM) and modeled (the busiest
chip's kernels walked by schedule.py, XLA's glue as schedule.py counts it unfused, the collectives over ICI by ici.py),
beside the same layer on one chip. Qwen3-30B-A3B and Gemma 4 26B-A4B, decode 64 and prefill 4096, bf16; the
expert-parallel layer's backward (training) compiled too ("bwd MiB/chip": arguments, temporaries and gradients).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

#: The scaled-down geometry of part 1: Qwen3-30B-A3B's shape divided by 4 (hidden, intermediate) and 4 (experts).
SIM = {"hidden": 512, "intermediate": 192, "experts": 32, "top_k": 8}
SIM_PHASES = {"decode": 64, "prefill": 1024}


def _simulated_worker(repeats: int) -> list[dict]:
    """Runs inside the 8-device subprocess."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    import kernel_hub as kh
    from kernel_hub.verify.timing import interleaved_samples

    rd = kh.get_local_kernel(ROOT / "kernels/pallas/ragged_dot")
    devices = np.array(jax.devices())
    h, i, e, k = SIM["hidden"], SIM["intermediate"], SIM["experts"], SIM["top_k"]
    rng = np.random.default_rng(0)
    wgu = jnp.asarray(rng.standard_normal((e, h, 2 * i)) / np.sqrt(h), jnp.float32)
    wd = jnp.asarray(rng.standard_normal((e, i, h)) / np.sqrt(i), jnp.float32)
    pair = (wgu[..., :i], wgu[..., i:])
    meshes = {"ep8": Mesh(devices, ("expert",)), "ep4xtp2": Mesh(devices.reshape(4, 2), ("expert", "tensor"))}
    rows = []
    for phase, t in SIM_PHASES.items():
        x = jnp.asarray(rng.standard_normal((t, h)), jnp.float32)
        ids = jnp.asarray(np.argsort(rng.random((t, e)), axis=1)[:, :k], jnp.int32)
        w = jnp.asarray(rng.random((t, k)), jnp.float32)
        calls = {"1 device": lambda x=x, ids=ids, w=w: rd.moe_experts(x, ids, w, wgu, wd)}
        for name, mesh in meshes.items():
            tensor = "tensor" if name == "ep4xtp2" else None
            for scheme in rd.SCHEMES:
                calls[f"{name} {scheme}"] = (lambda x=x, ids=ids, w=w, mesh=mesh, tensor=tensor, scheme=scheme:
                                             rd.moe_experts(x, ids, w, pair if tensor else wgu, wd, mesh=mesh,
                                                            expert_axis="expert", tensor_axis=tensor,
                                                            dispatch=scheme))
        samples = interleaved_samples(calls, repeats=repeats, warmup=1)
        for label, s in samples.items():
            layout, _, scheme = label.partition(" ")
            ne, nt = {"1": (1, 1), "ep8": (8, 1), "ep4xtp2": (4, 2)}[layout]
            sent = 0 if ne == 1 else rd.collective_bytes(scheme, rd.MoeSizes(t, h, k, e, ne, nt, 4))
            rows.append({"phase": phase, "tokens": t, "config": label, "median_s": statistics.median(s),
                         "min_s": min(s), "max_s": max(s), "bytes_sent_per_device": sent,
                         "repeats": repeats, **SIM})
    return rows


def simulated_rows(repeats: int) -> list[dict]:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    done = subprocess.run([sys.executable, __file__, "--simulated-worker", "--repeats", str(repeats)],
                          capture_output=True, text=True, env=env, timeout=1800)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("[")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the simulated-device run failed (exit {done.returncode}): {done.stderr[-500:]}")
    return json.loads(lines[-1])


def _table(head: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[c]) for r in [head, *body]) for c in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in [head, *body])


def simulated_table(rows: list[dict]) -> str:
    body = [(r["phase"], str(r["tokens"]), r["config"], f"{r['median_s'] * 1e3:.1f}",
             f"{r['min_s'] * 1e3:.1f}-{r['max_s'] * 1e3:.1f}", f"{r['bytes_sent_per_device'] / 2**10:.0f}")
            for r in rows]
    geo = ", ".join(f"{k} {v}" for k, v in SIM.items())
    return (f"8 simulated CPU devices sharing this host's cores ({geo}; f32; medians of interleaved runs)\n"
            + _table(("phase", "tokens", "config", "median ms", "min-max ms", "KiB sent/device"), body))


def tpu_table(rows: list[dict]) -> str:
    body = []
    for r in rows:
        mem = "-" if not r.get("compiled") else f"{(r['argument_bytes'] + r['temp_bytes']) / 2**20:.0f}"
        model = "-" if "model_bytes_per_chip" not in r else (
            f"{r['model_bytes_per_chip'] / 2**30:.1f}/{r['hbm_bytes'] / 2**30:.0f}"
            f"{'' if r['fits_hbm'] else ' NO'}")
        us = lambda key, r=r: f"{r[key] * 1e6:.0f}"
        coll = f"{(r['collective_bandwidth_s'] + r['collective_latency_s']) * 1e6:.0f}"
        bwd = "-" if not r.get("bwd_compiled") else (
            f"{(r['bwd_argument_bytes'] + r['bwd_temp_bytes'] + r['bwd_output_bytes']) / 2**20:.0f}")
        cf = "" if r["capacity_factor"] is None else f" cf{r['capacity_factor']:g}"
        body.append((r["generation"], r["model"], f"{r['phase']} {r['tokens']}", r["layout"] + cf, r["scheme"],
                     str(r["rows"]), us("kernels_s"), us("glue_s"), coll, us("modeled_s"), mem, model, bwd,
                     r.get("error") or r.get("bwd_error") or ""))
    head = ("chip", "model", "phase", "layout", "scheme", "rows/chip", "kernels us", "glue us", "collective us",
            "total us", "layer MiB/chip", "model GiB/HBM", "bwd MiB/chip", "compile error")
    return ("TPU slices (mock, libtpu compile + modeled; bf16; glue = XLA ops outside the kernels counted unfused, "
            "an upper bound)\n" + _table(head, body))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--skip-tpu", action="store_true", help="only the simulated-device timings")
    parser.add_argument("--skip-simulated", action="store_true", help="only the TPU model and compile")
    parser.add_argument("--generations", default="v5e,v6e", help="TPU generations (default v5e,v6e)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved timed runs per config (default 7)")
    parser.add_argument("--simulated-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.simulated_worker:
        print(json.dumps(_simulated_worker(args.repeats)))
        return 0
    out: dict[str, list[dict]] = {}
    if not args.skip_simulated:
        out["simulated"] = simulated_rows(args.repeats)
    if not args.skip_tpu:
        from kernel_hub.tpu.chips import parse_generations
        from tpu_cost_model.mesh import mesh_rows

        out["tpu"] = mesh_rows(parse_generations(args.generations), ("qwen3_30b_a3b", "gemma4_26b_a4b"),
                               capacity_factors=(None, 1.25), grad_layouts=("ep8",))
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print("\n\n".join(t for t in (simulated_table(out["simulated"]) if "simulated" in out else "",
                                      tpu_table(out["tpu"]) if "tpu" in out else "") if t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
