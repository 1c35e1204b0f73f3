"""torch <-> JAX hand-over for the torch-facing builds: DLPack on CPU/CUDA, torch_tpu's jax_op on TPU.

Used by the torch bridges of the kernels that vendor it. jax is imported only when a tensor crosses over, so the
torch-cpu builds load where jax is absent; torch_tpu only when a tensor is on a TPU (importing it elsewhere aborts).
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


def run_jax(fn: Callable[..., Any], *tensors: torch.Tensor) -> Any:
    """fn (a JAX function) on torch tensors: through torch_tpu on a TPU, through DLPack elsewhere; torch out."""
    if on_tpu(*tensors):
        return call_tpu(fn, *tensors)
    out = fn(*(to_jax(t) for t in tensors))
    return tuple(to_torch(o) for o in out) if isinstance(out, tuple | list) else to_torch(out)


def jax_entry(package: str, name: str) -> Callable[..., Any]:
    """The JAX entry function `name` of the kernel package this bridge ships in (its api module), imported
    relatively so it resolves inside whichever build the bridge was loaded from."""
    return getattr(importlib.import_module(".api", package), name)
