"""Our attention prefill alone, as bench/tpu_peers.py's prefill row models it (GPT-OSS-20B heads 64/8 x 64, 4096
causal, bf16, sinks, default tiles for the mock chip's VMEM): modeled time at the band's points and both ends, and
the vector work behind it. A quick check of a forward change without the peers' block sweeps; modeled, not measured.

  ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=src .venv-tpu/bin/python bench/prefill_modeled.py [v5e v6e]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(generations: list[str]) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import kernel_hub as kh
    from kernel_hub.tpu.chips import chip
    from kernel_hub.tpu.target import tpu_target
    from tpu_cost_model.schedule import kernel_cost

    fa = kh.get_local_kernel(ROOT / "kernels" / "pallas" / "flash_attention", framework="jax", backend="tpu")
    hq, hkv, d, s = 64, 8, 64, 4096
    sinks = np.zeros((hq,), np.float32)
    for gen in generations:
        with tpu_target(gen):
            q = jax.ShapeDtypeStruct((1, hq, s, d), jnp.bfloat16)
            kv = jax.ShapeDtypeStruct((1, hkv, s, d), jnp.bfloat16)
            cost = kernel_cost(lambda a, b, c, z: fa.flash_attention(a, b, c, causal=True, sm_scale=d ** -0.5, sinks=z,
                                                                     implementation="pallas", interpret=False),
                               q, kv, kv, sinks, generation=gen)
        c = chip(gen)
        lo, hi = cost.band(c)
        call = cost.calls[0]
        print(f"{gen}: modeled {cost.seconds(c) * 1e3:.3f} ms (band {lo * 1e3:.3f}..{hi * 1e3:.3f}), "
              f"{call.steps} steps, VPU {call.vpu_elems / 1e9:.2f} G, EUP {call.eup_elems / 1e9:.2f} G elements")


if __name__ == "__main__":
    main(sys.argv[1:] or ["v5e", "v6e"])
