"""TPU generations: the mock topology libtpu compiles for, and the public per-chip figures the cost model uses.

Figures are Google Cloud's published per-chip specs (https://cloud.google.com/tpu/docs/v4, .../v5e, .../v5p,
.../v6e, .../tpu7x): HBM bandwidth and peak bf16 dense FLOP/s (v7x: half its 4.6 PFLOP/s FP8). jax's own table
(jax._src.pallas.mosaic.tpu_info) agrees for v5e and v6e to within 0.3%; tests/test_tpu_model.py checks it.
v4 and v5p are megacore chips (two TensorCores as one device), v7x has two TensorCores; the cost model runs
one grid on one core at the chip's figures (optimistic for v7x, whose figures are per chip).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Per grid step of a Pallas TPU pipeline: the ~0.35 us the Pallas TPU docs quote for a pipeline step
#: (jax docs, "Pallas TPU" guides); also the figure flash_attention/config.py tiles against.
STEP_OVERHEAD_S = 0.35e-6

#: An f32 dot at Precision.HIGHEST runs as 6 bf16 MXU passes on TPU (XLA's bf16_6x decomposition).
F32_HIGHEST_PASSES = 6


@dataclass(frozen=True)
class Chip:
    generation: str
    topology: str  # the smallest mock topology libtpu accepts ("1x1" is refused)
    device_kind: str  # what the compiled-for device reports
    hbm_bytes_per_s: float
    bf16_flops_per_s: float
    megacore: bool
    source: str


CHIPS: dict[str, Chip] = {
    c.generation: c
    for c in (
        Chip("v4", "v4:2x2x1", "TPU v4", 1200e9, 275e12, True, "https://cloud.google.com/tpu/docs/v4"),
        Chip("v5e", "v5e:2x2", "TPU v5 lite", 819e9, 197e12, False, "https://cloud.google.com/tpu/docs/v5e"),
        Chip("v5p", "v5p:2x2x1", "TPU v5", 2765e9, 459e12, True, "https://cloud.google.com/tpu/docs/v5p"),
        Chip("v6e", "v6e:2x2", "TPU v6 lite", 1640e9, 918e12, False, "https://cloud.google.com/tpu/docs/v6e"),
        Chip("v7x", "tpu7x:2x2x1", "TPU7x", 7370e9, 2307e12, False, "https://cloud.google.com/tpu/docs/tpu7x"),
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
