"""Side-by-side timing: interleaved runs, their spread, and ratios with their spread. Shared by the demo, the
validation harness, the benches and the report.

A single median hides how noisy a shared 2-core machine is (one quick run saw 593, 59 and 33 ms for one
method), so every time is kept as a `Spread` (median, quartiles, min, max of the samples) and every
comparison as a `Ratio` with the interquartile range of the per-round ratios.

The one ratio convention (demo, benches, report, docs): RATIO_CONVENTION. `format_ratio` writes it, and
`ratio_disagreement` says when the median of the per-round ratios and the ratio of the medians printed beside it
tell different stories (a noisy machine: one round of 0.35 among 3.25 and 2.74); the formatted ratio then carries
both, with the reason, so a table never shows a ratio that contradicts its own medians unexplained.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from ..json_types import JsonValue

T = TypeVar("T")

RATIO_CONVENTION = ('"N.NNx faster" = baseline time / our time (>1: ours is faster), the median of the per-round '
                    "ratios with their quartiles in brackets")
#: The median of the per-round ratios and the ratio of the medians may differ by this much (relative) unflagged.
DISAGREEMENT_TOLERANCE = 0.25


def block(x: T) -> T:
    """Wait for an async result (JAX) so the clock measures the work."""
    leaves = x if isinstance(x, list | tuple) else [x]
    for leaf in leaves:
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
    return x


def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(q1, median, q3) with the inclusive method, so a quartile never leaves the samples' range."""
    data = sorted(values)
    if len(data) == 1:
        return data[0], data[0], data[0]
    q1, med, q3 = statistics.quantiles(data, n=4, method="inclusive")
    return q1, med, q3


@dataclass(frozen=True)
class Spread:
    """Summary of one method's samples (seconds): the median and how far the runs strayed from it."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        if not samples:
            raise ValueError("no samples to summarise")
        q1, med, q3 = _quartiles(samples)
        return cls(median=med, q1=q1, q3=q3, min=min(samples), max=max(samples), n=len(samples))

    def ms(self) -> dict[str, float | int]:
        """The JSON form used by every bench: milliseconds, keys median_ms, q1_ms, q3_ms, min_ms, max_ms, n."""
        return {f"{k}_ms": v * 1e3 for k, v in asdict(self).items() if k != "n"} | {"n": self.n}

    def __str__(self) -> str:
        return f"{self.median * 1e3:.2f} ms (IQR {self.q1 * 1e3:.2f}-{self.q3 * 1e3:.2f})"


@dataclass(frozen=True)
class Ratio:
    """How many times faster `ours` is than a baseline (>1: faster), with the interquartile range.

    paired: both were timed round-robin the same number of times (interleaved_samples), so each round gives one
    ratio baseline_i / ours_i and the value is their median, the range their quartiles. Otherwise the value is
    the ratio of medians and the range the widest one the quartiles allow (baseline q1/ours q3 .. q3/q1)."""

    value: float
    low: float
    high: float
    paired: bool
    of_medians: float | None = None  # baseline median / our median, for ratio_disagreement (None: not recorded)

    @classmethod
    def of(cls, baseline: Sequence[float], ours: Sequence[float]) -> Ratio:
        if not baseline or not ours:
            raise ValueError("a ratio needs samples on both sides")
        b, o = Spread.of(baseline), Spread.of(ours)
        of_medians = b.median / o.median if o.median > 0 else None
        if len(baseline) == len(ours) and all(t > 0 for t in ours):
            low, value, high = _quartiles([b / o for b, o in zip(baseline, ours, strict=True)])
            return cls(value=value, low=low, high=high, paired=True, of_medians=of_medians)
        return cls(value=b.median / o.median, low=b.q1 / o.q3, high=b.q3 / o.q1, paired=False, of_medians=of_medians)

    def to_dict(self) -> dict[str, float | bool | None]:
        return asdict(self)

    def __str__(self) -> str:
        return format_ratio(self)


def interleaved_samples(
    fns: Mapping[str, Callable[[], object]], *, repeats: int = 7, warmup: int = 1, settle: bool = False,
    gap_s: float = 0.0, calls: int = 1,
) -> dict[str, list[float]]:
    """Seconds of every run per callable, run round-robin with the order rotated each round, so machine
    noise and the cost of following another call (cold caches after a heavy one) hit all alike.

    settle: precede each timed call by one untimed call of the same callable, so that no method pays for
    the previous method's memory traffic (e.g. jax.lax.ragged_dot's dense G x M x N intermediate, whose
    freed pages the next call faults back in). Each method is then timed warm, still interleaved.
    gap_s: idle this long before each timed call, so that threads the previous call left spinning (OpenMP's
    workers spin-wait for milliseconds after a parallel region) are asleep before the next one starts.
    calls: each sample is the mean of this many back-to-back calls (after the gap), the steady state of a loop such
    as a decode step's layers, which never idle between calls; 1 times one call after the gap, wake-up included."""
    if calls < 1:
        raise ValueError(f"calls must be at least 1, not {calls}")
    for fn in fns.values():
        for _ in range(warmup):
            block(fn())
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            if settle:
                block(fns[name]())
            if gap_s:
                time.sleep(gap_s)
            start = time.perf_counter()
            for _ in range(calls):
                block(fns[name]())
            samples[name].append((time.perf_counter() - start) / calls)
    return samples


def first_and_warm(fn: Callable[[], T], *, runs: int = 3, budget_s: float = 1.0) -> tuple[T, float, list[float]]:
    """(first result, seconds of the first call, seconds of each warm call after it).

    The first call pays for tracing and compiling (JIT) as well as running; the warm calls pay for running
    only. Warm calls stop after `runs`, or once they have taken `budget_s` together (at least one is made),
    so a slow case (the TPU simulator) costs one extra run, a fast one a few."""
    start = time.perf_counter()
    result = block(fn())
    first = time.perf_counter() - start
    warm: list[float] = []
    while len(warm) < max(runs, 1) and (not warm or sum(warm) < budget_s):
        start = time.perf_counter()
        block(fn())
        warm.append(time.perf_counter() - start)
    return result, first, warm


def bench_records(
    samples: dict[str, list[float]], *, group: str, baseline: str | None, **fields: JsonValue
) -> list[dict[str, Any]]:
    """One JSON record per method in the benches' shared form: `group` (what was measured), `method`, the
    samples and their spread in ms (Spread.ms), and `vs_baseline` (Ratio.to_dict against `baseline`, None for
    the baseline itself or when it was not timed), plus `fields`."""
    base = samples.get(baseline) if baseline else None
    out = []
    for method, runs in samples.items():
        if not runs:
            continue
        ratio = Ratio.of(base, runs).to_dict() if base and method != baseline else None
        out.append({"group": group, "method": method, **fields, "samples_ms": [t * 1e3 for t in runs],
                    **Spread.of(runs).ms(), "vs_baseline": ratio})
    return out


def _x(value: float, digits_of: float | None = None) -> str:
    """2 decimals below 10x, 1 from there (by `digits_of`, so a range is written like its median)."""
    return f"{value:.{2 if (value if digits_of is None else digits_of) < 10 else 1}f}x"


def ratio_disagreement(value: float, of_medians: float | None, *,
                       tolerance: float = DISAGREEMENT_TOLERANCE) -> str | None:
    """Why a median of per-round ratios (`value`) and the ratio of the medians disagree, or None when they agree:
    they fall on different sides of 1 (one says faster, the other slower), or differ by more than `tolerance`."""
    if of_medians is None or value <= 0 or of_medians <= 0:
        return None
    if (value - 1.0) * (of_medians - 1.0) < 0:
        why = "one says faster, the other slower"
    elif abs(value / of_medians - 1.0) > tolerance:
        why = f"they differ by {abs(value / of_medians - 1.0):.0%}"
    else:
        return None
    return (f"but the medians' ratio is {_x(of_medians)}: {why}; the rounds disagreed (a noisy machine), "
            "rerun with more repeats")


def format_ratio(ratio: dict[str, Any] | Ratio | None) -> str:
    """A record's vs_baseline (or a Ratio) in RATIO_CONVENTION: "10.5x faster (9.8-11.2)", plus the ratio of the
    medians and the reason when ratio_disagreement finds one; "-" when there is none."""
    if ratio is None:
        return "-"
    r = ratio if isinstance(ratio, Ratio) else Ratio(**ratio)
    text = f"{_x(r.value)} faster ({_x(r.low, r.value)[:-1]}-{_x(r.high, r.value)[:-1]})"
    note = ratio_disagreement(r.value, r.of_medians)
    return f"{text}, {note}" if note else text
