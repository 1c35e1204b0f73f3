"""The ragged paged attention's tuned table (flash_attention/paged_tuned_table.py), made: per generation and model
geometry (Qwen3-30B-A3B 32/4 x 128, Gemma 4 26B-A4B sliding 16/8 x 256 window 1024 and global 16/2 x 512; pages of
128, bf16, 8192 positions), pages_per_block (8, 16, 32) swept on the decode batch (64 sequences of one new token)
and block_q (8, 16, 32) on the mixed batch (4 prefill chunks of 496 tokens beside 60 decode steps), each candidate
read by kernel-hub's TPU cost model (modeled, not measured), skipping candidates whose VMEM estimate passes the
chip's budget; the fastest is then compiled by libtpu for the generation (decode and mixed), and printed as a table
entry when both compile.

    python bench/paged_tune.py [--generations v5e,v6e,v7x] [--json]

Runs in the TPU environment (make setup-tpu), in a subprocess of it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = (8, 16, 32)
BLOCK_Q = (8, 16, 32)


def sweep(generations: list[str]) -> None:
    """Runs inside the TPU environment: one JSON line per (generation, geometry)."""
    import importlib
    import math

    import jax
    import numpy as np

    from kernel_hub.tpu.chips import chip
    from kernel_hub.tpu.package import folder_package
    from kernel_hub.tpu.target import on_device, topology_devices
    from kernel_hub.tpu.worker_common import load_package
    from tpu_cost_model import paged_peers as pp
    from tpu_cost_model.schedule import kernel_cost

    fa = load_package(folder_package(ROOT / "kernels/pallas/flash_attention").request())
    cfg_mod = importlib.import_module(f"{fa.__name__}.config")
    shapes = importlib.import_module(f"{fa.__name__}._vendor.attention_shapes")
    geos = {g.model: g for g in shapes.ATTENTION_MODELS}
    sds = jax.ShapeDtypeStruct
    for gen in generations:
        c = chip(gen)
        device = topology_devices(c.topology)[0]
        jax.config.update("jax_default_device", device)
        budget = cfg_mod.vmem_plan(c.device_kind)[0] * 5 // 8
        for model in pp.PAGED_MODELS:
            geo = geos[model]

            def call(phase, block_q, ppb, geo=geo):
                seqs = pp.batch(phase)
                meta = pp._metadata(seqs)
                tokens, b = sum(q for q, _ in seqs), len(seqs)
                cache = sds((b * (pp.CACHE // pp.PAGE), pp.PAGE, geo.hkv, geo.d), "bfloat16")
                args = (sds((tokens, geo.hq, geo.d), "bfloat16"), sds((tokens, geo.hkv, geo.d), "bfloat16"),
                        sds((tokens, geo.hkv, geo.d), "bfloat16"), cache, cache, meta["kv_lens"], meta["table"],
                        meta["cu"], meta["kv_lens"].shape[0])
                config = fa.AttentionConfig(paged_block_q=block_q, paged_pages_per_block=ppb)

                def step(q, k, v, kc, vc, lens, table, cu, n, geo=geo, config=config):
                    return fa.ragged_paged_attention(q, k, v, kc, vc, lens, table, cu, n,
                                                     sm_scale=1 / math.sqrt(geo.d), sliding_window=geo.window,
                                                     implementation="pallas", interpret=False, config=config)

                fn = jax.jit(step, donate_argnums=(3, 4))
                return fn, args

            def modeled(phase, block_q, ppb, call=call, gen=gen, c=c):
                fn, args = call(phase, block_q, ppb)
                return kernel_cost(fn, *args, generation=gen).seconds(c)

            def fits(rows, ppb, geo=geo, budget=budget):
                return cfg_mod.paged_vmem_bytes(rows, ppb * pp.PAGE, geo.hkv, geo.d, 2) <= budget

            decode = {p: modeled("decode", 1, p) for p in PAGES if fits(geo.hq // geo.hkv, p)}
            ppb = min(decode, key=decode.get, default=None)
            mixed = {q: modeled("mixed", q, ppb) for q in BLOCK_Q if ppb and fits(q * geo.hq // geo.hkv, ppb)}
            block_q = min(mixed, key=mixed.get, default=None)
            if ppb is None or block_q is None:  # no candidate within the VMEM estimate: no entry (the fallback)
                print(json.dumps({"model": model, "key": [gen], "skipped": "no candidate fits the VMEM budget"}))
                continue
            compiled = {}
            for phase, bq in (("decode", 1), ("mixed", block_q)):
                fn, args = call(phase, bq, ppb)
                abstract = tuple(a if isinstance(a, jax.ShapeDtypeStruct) else sds(np.shape(a), np.asarray(a).dtype)
                                 for a in args)
                try:
                    fn.lower(*on_device(abstract, device)).compile()
                    compiled[phase] = "yes"
                except Exception as exc:  # the compiler's refusal is the row
                    compiled[phase] = str(exc).strip().splitlines()[0][:200]
            key = [gen, pp.PAGE, "bfloat16", "bfloat16", geo.hq, geo.hkv, geo.d, pp.CACHE]
            print(json.dumps({"key": key, "block_q": block_q, "pages_per_block": ppb, "compiled": compiled,
                              "decode_us": {p: round(s * 1e6, 1) for p, s in decode.items()},
                              "mixed_us": {q: round(s * 1e6, 1) for q, s in mixed.items()},
                              "model": model, "window": geo.window}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", default="v5e,v6e,v7x")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--in-tpu-env", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    gens = [g.strip() for g in args.generations.split(",") if g.strip()]
    if args.in_tpu_env:
        sweep(gens)
        return 0
    sys.path.insert(0, str(ROOT / "src"))
    from kernel_hub.tpu.env import tpu_env

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT / "src"),
           "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    done = subprocess.run([str(tpu_env().python), __file__, "--in-tpu-env", "--generations", args.generations],
                          capture_output=True, text=True, env=env)
    rows = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not rows:
        print(done.stderr[-3000:], file=sys.stderr)
        return done.returncode or 1
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        if "skipped" in r:
            print(f"    # {r['key'][0]} {r['model']}: {r['skipped']}")
            continue
        ok = all(v == "yes" for v in r["compiled"].values())
        entry = f"    {tuple(r['key'])!r}: ({r['block_q']}, {r['pages_per_block']}),"
        print(entry if ok else f"    # not compiled {r['compiled']}: {entry.strip()}")
        print(f"    # modeled decode us by pages/step {r['decode_us']}, mixed us by block_q {r['mixed_us']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
