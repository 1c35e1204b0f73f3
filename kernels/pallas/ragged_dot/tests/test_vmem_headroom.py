"""The forward's tiles leave Mosaic room in VMEM on every declared generation, at both seed models' expert shapes.

Why: tiles whose estimate filled 92% of v4's 16 MiB compiled with libtpu 0.0.52 and ran out with 0.0.42.1 (what
`jax[tpu]==0.10.2` pins): "Ran out of memory in memory space vmem. Used 16.10M of 16.00M". The physical VMEM per core
comes from jax's own table (jax._src.pallas.mosaic.tpu_info), not from the kernel's chip facts, so a wrong entry
there cannot pass this test. Pure functions: no compiler, milliseconds.
"""

from __future__ import annotations

import pytest
from ragged_dot._vendor.chips import CHIPS
from ragged_dot.pallas.config import choose_config, vmem_bytes
from ragged_dot.pallas.quant import choose_quant_config, quant_vmem_bytes

#: At most this share of a core's physical VMEM for the blocks a tile estimate counts.
PHYSICAL_SHARE = 0.75
#: At most this share of the scoped-VMEM limit the kernel compiles with (Mosaic's own temporaries take the rest).
LIMIT_SHARE = 0.85
#: device_kind of each generation, as jax's table knows it.
DEVICE_KINDS = {"v4": "TPU v4", "v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite", "v7x": "TPU7x"}
#: (hidden, experts, top_k, expert intermediate): the seed models' public config.json.
MODELS = {"qwen3_30b_a3b": (2048, 128, 8, 768), "gemma4_26b_a4b": (2112, 128, 8, 704)}
PHASES = {"decode": 64, "prefill": 4096}


def physical_vmem(generation: str) -> int:
    from jax._src.pallas.mosaic import tpu_info

    version = tpu_info.chip_version_from_device_kind(DEVICE_KINDS[generation])
    return tpu_info.get_tpu_info_for_chip(version, 1).vmem_capacity_bytes


def shapes():
    """(label, M, K, N, G) of both projections of both models in both phases."""
    for model, (hidden, experts, top_k, inter) in MODELS.items():
        for phase, tokens in PHASES.items():
            m = tokens * top_k
            yield f"{model}:{phase}:gate_up", m, hidden, 2 * inter, experts
            yield f"{model}:{phase}:down", m, inter, hidden, experts


def test_every_declared_generation_is_checked():
    assert set(CHIPS) == set(DEVICE_KINDS)


@pytest.mark.parametrize("generation", sorted(DEVICE_KINDS))
def test_forward_tiles_keep_vmem_headroom(generation):
    chip, physical = CHIPS[generation], physical_vmem(generation)
    assert chip.vmem_bytes == physical  # the kernel's facts agree with jax's table
    for label, m, k, n, g in shapes():
        for dtype, item in (("bfloat16", 2), ("float32", 4)):
            cfg, _ = choose_config(m, k, n, g, dtype, chip=chip)
            need = vmem_bytes(cfg, item, item, -(-k // cfg.tk))
            limit = cfg.vmem_limit_bytes or chip.scoped_vmem_bytes
            where = (generation, label, dtype, cfg, need)
            assert need <= PHYSICAL_SHARE * physical, where
            assert need <= LIMIT_SHARE * limit <= physical, where
        for block_scales in (False, True):  # int8 per channel, fp8 128x128 blocks
            cfg, _ = choose_quant_config(m, k, n, g, "bfloat16", block_scales, chip=chip)
            need = quant_vmem_bytes(cfg, 2, 2, block_scales)
            limit = cfg.vmem_limit_bytes or chip.scoped_vmem_bytes
            where = (generation, label, "fp8" if block_scales else "int8", cfg, need)
            assert need <= PHYSICAL_SHARE * physical, where
            assert need <= LIMIT_SHARE * limit <= physical, where
