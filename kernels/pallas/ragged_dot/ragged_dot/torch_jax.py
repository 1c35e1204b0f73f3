"""torch <-> JAX hand-over for the torch-facing builds: DLPack on CPU/CUDA, torch_tpu's jax_op on TPU.

Shared by the torch bridges of several kernels (other kernel packages link this file; publishing ships
it as a plain file). torch_tpu is imported only when a tensor is on a TPU: importing it elsewhere aborts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch


def to_jax(t: torch.Tensor) -> Any:
    """Zero-copy view of a torch tensor as a jax.Array (copies only to make it contiguous)."""
    import jax

    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return jax.dlpack.from_dlpack(t)


def to_torch(a: Any) -> torch.Tensor:
    """Zero-copy view of a jax.Array as a torch tensor."""
    return torch.from_dlpack(a)


def on_tpu(*tensors: torch.Tensor) -> bool:
    return any(t.device.type not in ("cpu", "cuda", "meta") for t in tensors)


def call_tpu(fn: Callable[..., Any], *tensors: torch.Tensor) -> Any:
    """Run a JAX function on TPU-resident torch tensors through torch_tpu's jax_op (TPU hosts only)."""
    import torch_tpu

    jax_op = getattr(torch_tpu, "jax_op", None)
    if jax_op is None:
        jax_op = importlib.import_module("torch_tpu.jax").jax_op  # type: ignore[attr-defined]
    return jax_op(fn, *tensors)
