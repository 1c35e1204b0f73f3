"""Group sizes for validation and tests: the routings that exercise a ragged dot's edge cases.

Shared by the ragged-dot kernels' validation cases (other kernel packages link this file).
"""

from __future__ import annotations

import numpy as np

#: How group sizes are drawn. All are deterministic in the seed.
ROUTINGS = ("random", "empty_groups", "one_group", "partial", "all_empty", "all_but_last_empty")


def make_group_sizes(routing: str, m: int, g: int, rng: np.random.Generator) -> np.ndarray:
    """Group sizes summing to m (or less, for the routings that leave trailing rows)."""
    if routing == "random":
        return np.bincount(rng.integers(0, g, m), minlength=g)
    if routing == "empty_groups":  # about half the groups empty, others random
        live = rng.permutation(g)[: max(1, g // 2)]
        return np.bincount(live[rng.integers(0, live.size, m)], minlength=g)
    if routing == "one_group":
        sizes = np.zeros(g, np.int64)
        sizes[rng.integers(0, g)] = m
        return sizes
    if routing == "partial":  # rows past sum(group_sizes) must come out zero
        return np.bincount(rng.integers(0, g, max(1, (2 * m) // 3)), minlength=g)
    if routing == "all_empty":
        return np.zeros(g, np.int64)
    if routing == "all_but_last_empty":
        sizes = np.zeros(g, np.int64)
        sizes[-1] = m
        return sizes
    raise ValueError(f"unknown routing {routing!r}")
