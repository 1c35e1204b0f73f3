"""The rms_norm kind's decision: which form of the kernel matches a layer, from the errors its validation measured
(a pure function with its reason, like the generic decisions in layers/plan.py)."""

from __future__ import annotations

#: (zero_centered, scale_after_cast) in the order ties are broken: f32 results cannot tell the cast orders apart.
FORMS = ((False, True), (False, False), (True, False), (True, True))


def form_name(zero_centered: bool, scale_after_cast: bool) -> str:
    scale = "(1 + weight)" if zero_centered else "weight"
    return f"{scale} * x_normed, {'cast before scaling' if scale_after_cast else 'scaled in f32'}"


def choose_form(errors: list[float], tolerance: float) -> tuple[int | None, str]:
    """(index into FORMS of the closest form within tolerance or None, the reason)."""
    best = min(range(len(errors)), key=lambda i: (errors[i], i))
    summary = ", ".join(f"{form_name(*FORMS[i])}: {errors[i]:.1e}" for i in range(len(errors)))
    if errors[best] <= tolerance:
        return best, f"form matched on the layer's own outputs ({form_name(*FORMS[best])}: {errors[best]:.1e})"
    return None, f"validation failed: no form of the kernel matches this layer within {tolerance:.0e} ({summary})"
