"""The inter-chip interconnect (ICI) of an 8-chip TPU slice, for modelling the collectives of a sharded layer.

Figures from Google Cloud's per-chip specs (https://cloud.google.com/tpu/docs/v5e, .../v5p, .../v6e, .../tpu7x):
bidirectional ICI bandwidth per chip 400 GB/s (v5e), 1200 GB/s (v5p, 6 ports, 3D torus), 800 GB/s (v6e), 4 ports
and a 2D torus on v5e/v6e; one link carries bidirectional / (2 x ports) each way (100 GB/s on v5p and v6e).

Model: a collective over n chips runs as a bidirectional ring, which drives 2 of a chip's ports one way each, so a
chip sends at 2 links' rate; a collective permute (each chip sends to one neighbour) drives one link one way. A link
moves a payload at a fraction of its spec rate (link_efficiency). Time = bytes a chip sends / that rate + the
collective's fixed cost (fixed_seconds: its launch and the chips' synchronisation) + (steps - 1) x STEP_LATENCY_S,
with 2(n-1) ring steps for an all-reduce, n-1 for an all-gather, reduce-scatter or all-to-all, one for a permute; an
all-to-all's bytes travel the ring's mean hop count (n=8: 16/7 hops). The efficiency and the fixed cost come from
public measured collective permutes on v5p-8 and v6e-8 (bench/records/tpu_calibration.json, kind
"collective_permute") and live in rates.py with the other per-generation constants: measured on v5p and v6e, bands
on v5e and v7x; the per-step latency of a
ring's later steps is an assumption (ICI hops are described as sub-microsecond). At decode sizes the fixed costs
dominate.
"""

from __future__ import annotations

from dataclasses import dataclass

from .rates import LINK_EFFICIENCY, rates

__all__ = ["LINK_EFFICIENCY", "STEP_LATENCY_S", "collective_seconds", "fixed_seconds", "interconnect",
           "link_efficiency", "ring_hops"]

#: Assumed time of each ring step after a collective's first (not a published figure; see the module docstring).
STEP_LATENCY_S = 1e-6


def fixed_seconds(generation: str, end: str | None = None) -> float:
    """One collective's fixed cost on `generation` at the point or an end ("fast" / "slow") of its band
    (rates.py: measured on v5p and v6e, a band elsewhere)."""
    return rates(generation, end or "point").collective_fixed_s


def link_efficiency(generation: str, end: str | None = None) -> float:
    """The fraction of a link's spec rate a payload reaches on `generation` (rates.py: measured on v5p and v6e, a
    band elsewhere)."""
    return rates(generation, end or "point").ici_link_efficiency


@dataclass(frozen=True)
class Interconnect:
    generation: str
    bidirectional_bytes_per_s: float
    ports: int
    hbm_bytes: int
    slice8: str  # the 8-chip mock topology libtpu compiles for
    source: str

    def link_rate(self, end: str | None = None) -> float:
        """What one link moves one way per second: bidirectional / (2 x ports), at the generation's efficiency."""
        return link_efficiency(self.generation, end) * self.bidirectional_bytes_per_s / (2 * self.ports)

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_rate()

    @property
    def ring_bytes_per_s(self) -> float:
        """What one chip sends per second in a bidirectional ring: two links, one way each."""
        return 2 * self.link_bytes_per_s


ICI: dict[str, Interconnect] = {
    i.generation: i
    for i in (
        Interconnect("v5e", 400e9, 4, 16 * 2**30, "v5e:2x4", "https://cloud.google.com/tpu/docs/v5e"),
        Interconnect("v5p", 1200e9, 6, 95 * 2**30, "v5p:2x2x2", "https://cloud.google.com/tpu/docs/v5p"),
        Interconnect("v6e", 800e9, 4, 32 * 2**30, "v6e:2x4", "https://cloud.google.com/tpu/docs/v6e"),
        # 4 chips of 2 devices each (chips.py): 8 devices; 1.2 TB/s bidirectional ICI and 192 GB HBM per chip
        Interconnect("v7x", 1200e9, 4, 192 * 10**9, "tpu7x:2x2x1", "https://cloud.google.com/tpu/docs/tpu7x"),
    )
}


def interconnect(generation: str) -> Interconnect:
    """The ICI figures of a generation; ValueError naming the modelled ones otherwise."""
    key = generation.strip().lower()
    if key not in ICI:
        raise ValueError(f"no ICI figures for TPU generation {generation!r}; modelled: {', '.join(ICI)}")
    return ICI[key]


def ring_hops(n: int) -> float:
    """Mean hops from a chip to the n-1 others on a bidirectional ring of n."""
    return 0.0 if n <= 1 else sum(min(d, n - d) for d in range(1, n)) / (n - 1)


_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1, "reduce_scatter": lambda n: n - 1,
          "all_to_all": lambda n: n - 1, "collective_permute": lambda n: 1}


def collective_seconds(kind: str, devices: int, bytes_sent: float, generation: str,
                       end: str | None = None) -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of one collective in which each of `devices` chips sends `bytes_sent`;
    `end` ("fast" / "slow") takes the fixed cost and, where unmeasured, the link efficiency at that end of their
    bands."""
    if kind not in _STEPS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(_STEPS)}")
    if devices <= 1:
        return 0.0, 0.0
    ici = interconnect(generation)
    link, fixed = ici.link_rate(end), fixed_seconds(ici.generation, end)
    if kind == "collective_permute":
        return bytes_sent / link, fixed
    hops = ring_hops(devices) if kind == "all_to_all" else 1.0
    return bytes_sent * hops / (2 * link), fixed + (_STEPS[kind](devices) - 1) * STEP_LATENCY_S
