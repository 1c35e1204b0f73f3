"""Torch-facing entry of the RMSNorm kernel (the package __init__ of the torch-* builds).

`rms_norm(x[..., H], weight[H], *, eps, zero_centered=False, scale_after_cast=False)` has the JAX entry's contract
on torch tensors: float32 arithmetic, x's dtype out, differentiable in x and weight. The kernel contract's
`implementation=`: on CPU torch-native first (torch_cpu.py; jax is never imported, so the torch-cpu build runs where
only torch is installed); elsewhere the JAX entry first (torch_bridge.py): through DLPack on CUDA, as the TorchTPU op
`kernel_hub_rms_norm_v<version>::rms_norm` on TPU tensors (the torch-tpu build's entry registers it).
`layers` holds HF kernels' layer classes (`RMSNorm`, ...) built on this function.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from . import layers
from ._vendor.torch_dispatch import IMPLEMENTATIONS, ORDER, TorchDispatch
from ._vendor.torch_tpu_ops import op_namespace, package_digest
from .operands import check_operands
from .release import VERSION
from .torch_cpu import rms_norm_torch

__all__ = [
    "IMPLEMENTATIONS",
    "ORDER",
    "describe",
    "implementations_for",
    "last_implementation",
    "layers",
    "resolve_implementation",
    "rms_norm",
]

_NAMESPACE = op_namespace("rms_norm", VERSION, package_digest(Path(__file__).parent))
_DISPATCH = TorchDispatch("rms_norm", native=lambda: "torch-native RMSNorm (f32)", tpu_op=f"{_NAMESPACE}::rms_norm")
#: Every dispatch of this entry (the torch-tpu build's entry hooks its device notice into each).
DISPATCHES = (_DISPATCH,)
implementations_for, resolve_implementation, last_implementation, describe = _DISPATCH.exports()


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    zero_centered: bool = False,
    scale_after_cast: bool = False,
    implementation: str | Sequence[str] | None = None,
) -> torch.Tensor:
    """RMSNorm of x[..., H] over the last axis with weight[H] -> x's shape and dtype (see the JAX entry).

    implementation: "torch" (native) or "jax" (the Pallas/XLA kernel through the bridge), a name or a sequence
    tried in order; None: implementations_for(x.device).
    """
    eps = check_operands(tuple(x.shape), tuple(weight.shape), eps)
    options = dict(eps=eps, zero_centered=bool(zero_centered), scale_after_cast=bool(scale_after_cast))

    def call(name: str) -> torch.Tensor:
        if name == "torch" or x.numel() == 0:
            return rms_norm_torch(x, weight, **options)
        from .torch_bridge import rms_norm_jax

        return rms_norm_jax(x, weight, **options)

    return _DISPATCH.run(x.device, implementation, call, entry="rms_norm")
