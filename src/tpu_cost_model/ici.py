"""The inter-chip interconnect (ICI) of an 8-chip TPU slice, for modelling the collectives of a sharded layer.

Figures from Google Cloud's per-chip specs (https://cloud.google.com/tpu/docs/v5e, .../v5p, .../v6e, .../tpu7x):
bidirectional ICI bandwidth per chip 400 GB/s (v5e), 1200 GB/s (v5p, 6 ports, 3D torus), 800 GB/s (v6e), 4 ports
and a 2D torus on v5e/v6e; one link carries bidirectional / (2 x ports) each way (100 GB/s on v5p and v6e).

Model: a collective over n chips runs as a bidirectional ring, which drives 2 of a chip's ports one way each, so a
chip sends at 2 links' rate; a collective permute (each chip sends to one neighbour) drives one link one way. A link
moves a payload at LINK_EFFICIENCY of its spec rate. Time = bytes a chip sends / that rate + the collective's fixed
cost (COLLECTIVE_FIXED_S: its launch and the chips' synchronisation) + (steps - 1) x STEP_LATENCY_S, with 2(n-1)
ring steps for an all-reduce, n-1 for an all-gather, reduce-scatter or all-to-all, one for a permute; an
all-to-all's bytes travel the ring's mean hop count (n=8: 16/7 hops). The efficiency and the fixed cost come from
public measured collective permutes on v5p-8 and v6e-8 (bench/records/tpu_calibration.json, kind
"collective_permute"); the per-step latency of a ring's later steps is an assumption (ICI hops are described as
sub-microsecond), and at decode sizes the fixed costs dominate.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Assumed time of each ring step after a collective's first (not a published figure; see the module docstring).
STEP_LATENCY_S = 1e-6

#: What one collective costs before its payload moves (launch, synchronisation), from the public measured permutes
#: (marin-community/marin issue 6736, barriered `lax.ppermute` slopes on v5p-8 and v6e-8): point 5.0 us, between
#: the small-payload times (v5p ~4.5-5.5 us, v6e ~5.6-5.9 us for 1-16 KiB); its band runs from the lowest intercept of
#: the thread's large-payload fits (v6e 2.29 us) to the highest small-payload time (5.9 us). Not measured on v5e or
#: v7x: the same figures stand for them.
COLLECTIVE_FIXED_S = {None: 5.0e-6, "fast": 2.29e-6, "slow": 5.9e-6}

#: The fraction of a link's spec one-way rate a collective's payload reaches: fitted on row "v6e-ppermute-64MiB"
#: (64 MiB in 776.34 us measured, less COLLECTIVE_FIXED_S, over one 100 GB/s link); v5p's two rows and v6e's 1 MiB
#: row check it.
LINK_EFFICIENCY = 64 * 2**20 / ((776.34e-6 - COLLECTIVE_FIXED_S[None]) * 100e9)


@dataclass(frozen=True)
class Interconnect:
    generation: str
    bidirectional_bytes_per_s: float
    ports: int
    hbm_bytes: int
    slice8: str  # the 8-chip mock topology libtpu compiles for
    source: str

    @property
    def link_bytes_per_s(self) -> float:
        """What one link moves one way per second: bidirectional / (2 x ports), at LINK_EFFICIENCY."""
        return LINK_EFFICIENCY * self.bidirectional_bytes_per_s / (2 * self.ports)

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
    `end` ("fast" / "slow") takes the fixed cost at that end of its band."""
    if kind not in _STEPS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(_STEPS)}")
    if devices <= 1:
        return 0.0, 0.0
    ici = interconnect(generation)
    if kind == "collective_permute":
        return bytes_sent / ici.link_bytes_per_s, COLLECTIVE_FIXED_S[end]
    hops = ring_hops(devices) if kind == "all_to_all" else 1.0
    latency = COLLECTIVE_FIXED_S[end] + (_STEPS[kind](devices) - 1) * STEP_LATENCY_S
    return bytes_sent * hops / ici.ring_bytes_per_s, latency
