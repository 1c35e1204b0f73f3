"""Side-by-side timing: interleaved runs, medians. Shared by the demo and the benches."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def block(x: Any) -> Any:
    """Wait for an async result (JAX) so the clock measures the work."""
    leaves = x if isinstance(x, list | tuple) else [x]
    for leaf in leaves:
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
    return x


def interleaved_samples(
    fns: dict[str, Callable[[], Any]], *, repeats: int = 7, warmup: int = 1, settle: bool = False
) -> dict[str, list[float]]:
    """Seconds of every run per callable, run round-robin with the order rotated each round, so machine
    noise and the cost of following another call (cold caches after a heavy one) hit all alike.

    settle: precede each timed call by one untimed call of the same callable, so that no method pays for
    the previous method's memory traffic (e.g. jax.lax.ragged_dot's dense G x M x N intermediate, whose
    freed pages the next call faults back in). Each method is then timed warm, still interleaved."""
    for fn in fns.values():
        for _ in range(warmup):
            block(fn())
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            if settle:
                block(fns[name]())
            start = time.perf_counter()
            block(fns[name]())
            samples[name].append(time.perf_counter() - start)
    return samples


def interleaved_medians(
    fns: dict[str, Callable[[], Any]], *, repeats: int = 7, warmup: int = 1, settle: bool = False
) -> dict[str, float]:
    """Median seconds per callable over interleaved, rotated runs (see interleaved_samples)."""
    samples = interleaved_samples(fns, repeats=repeats, warmup=warmup, settle=settle)
    return {name: statistics.median(s) for name, s in samples.items()}
