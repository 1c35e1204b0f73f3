"""The inter-chip interconnect (ICI) of an 8-chip TPU slice, for modelling the collectives of a sharded layer.

Figures from Google Cloud's per-chip specs (https://cloud.google.com/tpu/docs/v5e, .../v6e): bidirectional ICI
bandwidth per chip 400 GB/s (v5e) and 800 GB/s (v6e), 4 ICI ports per chip, 2D torus; HBM capacity per chip
16 GiB (v5e) and 32 GiB (v6e) (the pages say "16 GB" / "32 GB").

Model (stated, not measured: no TPU was available): a collective over n chips runs as a bidirectional ring, which
drives 2 of a chip's 4 ports, each direction of a port carrying 1/8 of the bidirectional total, so a chip sends at
bidirectional/4 (v5e 100 GB/s, v6e 200 GB/s). Time = bytes a chip sends / that rate + steps x STEP_LATENCY_S, with
2(n-1) steps for an all-reduce and n-1 for an all-gather, reduce-scatter or all-to-all; an all-to-all's bytes travel
the ring's mean hop count (n=8: 16/7 hops). The per-step latency is an assumption (ICI hops are described as
sub-microsecond; 1 us per step also covers the collective's synchronisation), and it dominates at decode sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Assumed time per step of a ring collective (not a published figure; see the module docstring).
STEP_LATENCY_S = 1e-6


@dataclass(frozen=True)
class Interconnect:
    generation: str
    bidirectional_bytes_per_s: float
    ports: int
    hbm_bytes: int
    slice8: str  # the 8-chip mock topology libtpu compiles for
    source: str

    @property
    def ring_bytes_per_s(self) -> float:
        """What one chip sends per second in a bidirectional ring: 2 ports x (bidirectional / (2 x ports))."""
        return 2 * self.bidirectional_bytes_per_s / (2 * self.ports)


ICI: dict[str, Interconnect] = {
    i.generation: i
    for i in (
        Interconnect("v5e", 400e9, 4, 16 * 2**30, "v5e:2x4", "https://cloud.google.com/tpu/docs/v5e"),
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
          "all_to_all": lambda n: n - 1}


def collective_seconds(kind: str, devices: int, bytes_sent: float, generation: str) -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of one collective in which each of `devices` chips sends `bytes_sent`."""
    if kind not in _STEPS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(_STEPS)}")
    if devices <= 1:
        return 0.0, 0.0
    ici = interconnect(generation)
    hops = ring_hops(devices) if kind == "all_to_all" else 1.0
    return bytes_sent * hops / ici.ring_bytes_per_s, _STEPS[kind](devices) * STEP_LATENCY_S
