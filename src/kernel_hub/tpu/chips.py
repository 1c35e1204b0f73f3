"""TPU generations: the mock topology libtpu compiles for, and the public figures the cost model uses, per device.

Every figure is per JAX device, the unit one Pallas kernel runs on. Google Cloud publishes per-chip specs
(https://cloud.google.com/tpu/docs/v4, .../v5e, .../v5p, .../v6e, .../tpu7x): HBM bandwidth and peak bf16 dense
FLOP/s (v7x: half its 4.6 PFLOP/s FP8); a Chip keeps them as published and divides by `devices_per_chip`. v5e and
v6e have one TensorCore, v4 and v5p two run as one device (megacore), so a chip is one device; v7x's two
TensorCores are two devices (no megacore; each has its own half of the HBM), so its figures are halved. jax's own
per-TensorCore table (jax._src.pallas.mosaic.tpu_info) agrees for v5e, v6e and v7x to within 0.5%;
tests/tpu/test_tpu_model.py checks it. A whole v7x chip serving one layer runs it split over its two devices (e.g.
expert-parallel 2); the cost model costs one device.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chip:
    generation: str
    topology: str  # the smallest mock topology libtpu accepts ("1x1" is refused)
    device_kind: str  # what the compiled-for device reports
    chip_hbm_bytes_per_s: float  # Google's published per-chip figure
    chip_bf16_flops_per_s: float  # Google's published per-chip figure
    megacore: bool  # two TensorCores run as one device (v4, v5p)
    devices_per_chip: int  # JAX devices on one chip: 2 for v7x (a device per TensorCore), else 1
    source: str

    @property
    def hbm_bytes_per_s(self) -> float:
        """HBM bandwidth of one device: a kernel runs on one, and each of v7x's two has its own half of the HBM."""
        return self.chip_hbm_bytes_per_s / self.devices_per_chip

    @property
    def bf16_flops_per_s(self) -> float:
        """Peak bf16 dense FLOP/s of one device (its own MXUs; the other device's are out of a kernel's reach)."""
        return self.chip_bf16_flops_per_s / self.devices_per_chip


CHIPS: dict[str, Chip] = {
    c.generation: c
    for c in (
        Chip("v4", "v4:2x2x1", "TPU v4", 1200e9, 275e12, True, 1, "https://cloud.google.com/tpu/docs/v4"),
        Chip("v5e", "v5e:2x2", "TPU v5 lite", 819e9, 197e12, False, 1, "https://cloud.google.com/tpu/docs/v5e"),
        Chip("v5p", "v5p:2x2x1", "TPU v5", 2765e9, 459e12, True, 1, "https://cloud.google.com/tpu/docs/v5p"),
        Chip("v6e", "v6e:2x2", "TPU v6 lite", 1640e9, 918e12, False, 1, "https://cloud.google.com/tpu/docs/v6e"),
        Chip("v7x", "tpu7x:2x2x1", "TPU7x", 7370e9, 2307e12, False, 2, "https://cloud.google.com/tpu/docs/tpu7x"),
    )
}


def chip(generation: str) -> Chip:
    """The chip for a generation name ("v5e"); ValueError naming the known ones otherwise."""
    key = generation.strip().lower()
    if key not in CHIPS:
        raise ValueError(f"unknown TPU generation {generation!r}; known: {', '.join(CHIPS)}")
    return CHIPS[key]


def parse_generations(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """"v5e,v6e" or ["v5e", "v6e"] -> ("v5e", "v6e"), each checked, order kept, duplicates dropped."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in items:
        if not item.strip():
            continue
        name = chip(item).generation
        if name not in out:
            out.append(name)
    if not out:
        raise ValueError("no TPU generation given; known: " + ", ".join(CHIPS))
    return tuple(out)
