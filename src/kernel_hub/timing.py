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


def interleaved_medians(fns: dict[str, Callable[[], Any]], *, repeats: int = 7, warmup: int = 1) -> dict[str, float]:
    """Median seconds per callable, running them round-robin so machine noise hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            block(fn())
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            block(fn())
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}
