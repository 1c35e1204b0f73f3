"""Per-generation TPU facts the kernels' tile choices read, and the one map from a device kind to them.

Kernels take these as arguments (chip facts are injected, never asked of the runtime while tracing:
pltpu.get_tpu_info() breaks CPU interpret mode). Vendored into each kernel that sizes tiles by chip.
Every figure is per JAX device, the one TensorCore (two as megacore on v4/v5p) a kernel runs on: a v7x chip is two
devices, so its published per-chip figures are halved here.
"""

from __future__ import annotations

import dataclasses

_MIB = 1024 * 1024
#: The scoped VMEM every generation grants a kernel that does not ask for more.
DEFAULT_SCOPED_VMEM_BYTES = 16 * _MIB


@dataclasses.dataclass(frozen=True)
class ChipFacts:
    """What a tile choice needs to know about the device (one TensorCore, or a megacore pair) a kernel runs on."""

    name: str
    vmem_bytes: int  # physical VMEM per TensorCore (jax._src.pallas.mosaic.tpu_info)
    scoped_vmem_bytes: int  # Mosaic's default scoped-VMEM limit (what a kernel gets without asking)
    hbm_bytes_per_s: float  # per device
    bf16_flops_per_s: float  # per device


#: Google Cloud's published per-chip HBM bandwidth and bf16 peak over the JAX devices per chip (v7x: 2, one per
#: TensorCore; megacore v4/v5p: 1), so per device as jax's tpu_info table gives them; VMEM per core from that table.
_V7X_DEVICES_PER_CHIP = 2
CHIPS: dict[str, ChipFacts] = {
    c.name: c
    for c in (
        ChipFacts("v4", 16 * _MIB, 16 * _MIB, 1200e9, 275e12),
        ChipFacts("v5e", 128 * _MIB, 16 * _MIB, 819e9, 197e12),
        ChipFacts("v5p", 64 * _MIB, 16 * _MIB, 2765e9, 459e12),
        ChipFacts("v6e", 128 * _MIB, 32 * _MIB, 1640e9, 918e12),
        ChipFacts("v7x", 64 * _MIB, 32 * _MIB, 7370e9 / _V7X_DEVICES_PER_CHIP, 2307e12 / _V7X_DEVICES_PER_CHIP),
    )
}
#: Share of a core's physical VMEM a kernel's tile estimate may fill, on every generation. Why: Mosaic keeps
#: temporaries of its own beyond the blocks a kernel's estimate counts, and how many depends on the compiler: tiles
#: estimated at 92% of v4's 16 MiB compiled with libtpu 0.0.52 and ran out with 0.0.42.1 (what jax[tpu]==0.10.2
#: pins), "Used 16.10M of 16.00M". A quarter kept free holds on every generation with both.
VMEM_BUDGET_FRACTION = 0.75


def tile_budget_bytes(chip: ChipFacts) -> int:
    """VMEM a kernel's tiles may be sized against on `chip`: VMEM_BUDGET_FRACTION of its physical VMEM (above the
    scoped default, the kernel raises its scoped limit to fit; v4's physical VMEM is its scoped default)."""
    return int(chip.vmem_bytes * VMEM_BUDGET_FRACTION)


#: Substrings of `device.device_kind` ("TPU v6 lite", "TPU v5 lite", "TPU v5", "TPU v4", "TPU7x"), most specific first.
_KIND_MARKS: tuple[tuple[str, str], ...] = (
    ("v5 lite", "v5e"), ("v5e", "v5e"), ("v6", "v6e"), ("7x", "v7x"), ("tpu7", "v7x"),
    ("v5p", "v5p"), ("tpu v5", "v5p"), ("v4", "v4"),
)


def chip_for_device_kind(kind: str | None) -> ChipFacts | None:
    """The facts of a device kind, None for anything else (a CPU, an unrecognised device)."""
    text = str(kind or "").strip().lower()
    return next((CHIPS[gen] for mark, gen in _KIND_MARKS if mark in text), None) if text else None
