"""Integer tiling arithmetic the kernels share (pure Python: block sizes are static)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b."""
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    """The smallest multiple of b that is >= a."""
    return cdiv(a, b) * b
