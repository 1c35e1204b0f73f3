"""The check every ragged-dot entry (JAX and torch) makes on concrete group sizes. Pure Python: the torch-cpu build
imports it without jax."""

from __future__ import annotations

from collections.abc import Sequence


def check_group_sizes(group_sizes: Sequence[int], m: int) -> None:
    """Concrete group sizes: none negative and their sum at most lhs's M rows (else one ValueError naming them).
    Traced sizes cannot be checked; every entry then normalises them the same way (groups.normalize_group_sizes)."""
    sizes = [int(s) for s in group_sizes]
    negative = [g for g, s in enumerate(sizes) if s < 0]
    if negative:
        raise ValueError(f"group_sizes must be non-negative, got {sizes[negative[0]]} for group {negative[0]} "
                         f"(of {sizes})")
    if sum(sizes) > m:
        raise ValueError(f"group_sizes sum to {sum(sizes)}, more than lhs's {m} rows: group_sizes must sum to at "
                         "most M (rows past the sum come out zero)")
