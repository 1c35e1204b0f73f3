"""The attention kind's decision: whether a transformers model may switch to "kernel_hub" attention at all, from the
outputs its validation forwards gave (a pure function with its reason, like the generic decisions in
layers/plan.py)."""

from __future__ import annotations

from typing import Any

from ....verify.numerics import relative_error


def switch_check(before: list[Any], after: list[Any], tol: float, previous: str | None) -> str:
    """Why a transformers model may not switch to "kernel_hub" attention ("" if it may). `after` is the model
    switched, every layer returning its previous implementation's output: anything but `before` means the model
    computes differently under another implementation name, beyond the attention function kernelize swaps."""
    errors = [relative_error(a, b) for a, b in zip(after, before, strict=True) if a is not None and b is not None]
    err = max(errors, default=0.0)
    if err <= tol:
        return ""
    return (f"the model computes differently once its attention implementation is not {previous!r} (output error "
            f"{err:.2e} > {tol:.0e} with every layer on its previous implementation)")
