"""The rms_norm kind's contract: its name (what kernel.yaml `replaces` and registry.yaml `layers` call it) and the
Protocol its kernel keeps in its torch entry (tests/verify/test_kernel_contract.py holds every kernel that `replaces`
the kind to it). Typing only: importing this imports no framework."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

NAME = "rms_norm"


class RMSNormKernel(Protocol):
    """Layer kind `rms_norm`: x[..., H], weight[H] -> x's shape and dtype, weight * x_normed or (1 + weight) * x_normed,
    scaled in f32 or after the cast to x's dtype."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, *, eps: float, zero_centered: bool = False,
                 scale_after_cast: bool = False) -> torch.Tensor:
        ...
