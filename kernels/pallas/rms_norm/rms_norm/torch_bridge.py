"""torch <-> JAX for RMSNorm: the package's JAX rms_norm on torch tensors.

CPU and CUDA: DLPack (torch_jax.call_jax), differentiable in x and weight through jax.vjp of the entry (its
custom_vjp supplies the Pallas or XLA backward). TPU tensors: the torch op `kernel_hub_rms_norm_v<version>::rms_norm`
that torch_tpu's jax_op registers from the same function with the TPU order ("pallas", then "xla") and
interpret=False (Mosaic), once per process. Imported only when the "jax" implementation runs (it imports jax).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jax
import torch

from ._vendor.torch_jax import call_jax, jax_entry
from ._vendor.torch_tpu_ops import OpSpec, TpuOps, on_tpu, package_digest
from .release import VERSION

#: x and weight get gradients.
DIFFERENTIABLE = (0, 1)


@functools.cache  # one forward per option pair: call_jax caches its backward by it
def rms_norm_function(implementation: Any, interpret: Any) -> Any:
    """The JAX rms_norm with the contract's options fixed, annotated for torch_tpu's jax_op."""
    entry = jax_entry(__package__, "rms_norm")

    def rms_norm(x: jax.Array, weight: jax.Array, *, eps: float, zero_centered: bool,
                 scale_after_cast: bool) -> jax.Array:
        return entry(x, weight, eps=eps, zero_centered=zero_centered, scale_after_cast=scale_after_cast,
                     implementation=implementation, interpret=interpret)

    return rms_norm


def tpu_specs() -> list[OpSpec]:
    """What the torch-tpu build registers: rms_norm with the JAX package's TPU order, compiled by Mosaic."""
    order = jax_entry(__package__, "implementations_for")("tpu")
    return [OpSpec("rms_norm", rms_norm_function(order, False), DIFFERENTIABLE)]


TPU_OPS = TpuOps("rms_norm", VERSION, package_digest(Path(__file__).parent), tpu_specs)


def rms_norm_jax(x: torch.Tensor, weight: torch.Tensor, *, eps: float, zero_centered: bool,
                 scale_after_cast: bool) -> torch.Tensor:
    """The JAX rms_norm on torch tensors, differentiable in x and weight."""
    options = dict(eps=eps, zero_centered=zero_centered, scale_after_cast=scale_after_cast)
    if on_tpu(x, weight):
        return TPU_OPS.get("rms_norm")(x, weight, **options)
    return call_jax(rms_norm_function(None, None), (x, weight), options, differentiable=DIFFERENTIABLE)
