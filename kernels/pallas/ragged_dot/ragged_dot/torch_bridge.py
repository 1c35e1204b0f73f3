"""torch <-> JAX for the ragged dot: the package's JAX ragged_dot on torch tensors, one annotated function for both.

CPU and CUDA: DLPack (torch_jax.call_jax), zero-copy for contiguous f32/bf16. TPU tensors: the torch op
`kernel_hub_ragged_dot_<version, digest>::ragged_dot` that torch_tpu's jax_op registers from the same function with the
TPU order ("pallas", then "xla") and interpret=False (Mosaic), once per process (torch_tpu_ops.TpuOps). Gradients
in lhs and rhs come from jax.vjp of it on both paths: the kernel's custom_vjp supplies the Pallas backward kernels.

Quantized weights (int8 rhs with [G, 1, N] scales, float8_e4m3fn with [G, ceil(K/128), ceil(N/128)] block scales) have
their own entry, `ragged_dot_quantized` (the op `<namespace>::ragged_dot_quantized` on TPU): the JAX ragged_dot with
rhs_scale, so a TPU reads the 1-byte weights from HBM and dequantizes them in VMEM. Its gradient is in lhs only (the
weights are frozen; the JAX entry gives rhs and rhs_scale zero cotangents). int8 and float8_e4m3fn tensors cross
DLPack as they are (torch 2.13 / jax 0.10 both export and import them; no bit-casting), and torch_tpu's jax_op maps
both dtypes too.

Imported only when the "jax" implementation runs (it imports jax): the torch-cpu build never imports it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jax
import numpy as np
import torch

from ._vendor.torch_jax import call_jax, jax_dtype, jax_entry
from ._vendor.torch_tpu_ops import OpSpec, TpuOps, on_tpu, package_digest
from .release import VERSION

#: lhs and rhs get gradients; group_sizes (integers) does not.
DIFFERENTIABLE = (0, 1)
#: Quantized weights: lhs gets its gradient; rhs_scale is listed only so the backward returns two tensors (torch_tpu's
#: jax_op gives a one-element tuple return the schema `-> Tensor` and then cannot cast the tuple): its cotangent is
#: the JAX entry's zero, and torch never asks for it (the torch entry refuses a scale that requires grad). rhs (int8
#: or fp8 bytes) and group_sizes are not differentiated.
QUANTIZED_DIFFERENTIABLE = (0, 2)


@functools.cache  # one forward per option pair: call_jax caches its backward by it
def ragged_dot_function(implementation: Any, interpret: Any) -> Any:
    """The JAX ragged_dot with the contract's options fixed, annotated the way torch_tpu's jax_op reads a schema
    off: `(Tensor lhs, Tensor rhs, Tensor group_sizes, *, ScalarType preferred_element_type) -> Tensor`."""
    entry = jax_entry(__package__, "ragged_dot")

    def ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                   preferred_element_type: np.dtype) -> jax.Array:
        return entry(lhs, rhs, group_sizes, preferred_element_type=preferred_element_type,
                     implementation=implementation, interpret=interpret)

    return ragged_dot


@functools.cache  # one forward per option pair, as above
def ragged_dot_quantized_function(implementation: Any, interpret: Any) -> Any:
    """The JAX ragged_dot on quantized weights (its rhs_scale), the same way annotated: `(Tensor lhs, Tensor rhs,
    Tensor rhs_scale, Tensor group_sizes, *, ScalarType preferred_element_type) -> Tensor`. Differentiated at
    QUANTIZED_DIFFERENTIABLE, never in rhs: an int8 rhs is an integer input jax.vjp refuses."""
    entry = jax_entry(__package__, "ragged_dot")

    def ragged_dot_quantized(lhs: jax.Array, rhs: jax.Array, rhs_scale: jax.Array, group_sizes: jax.Array, *,
                             preferred_element_type: np.dtype) -> jax.Array:
        return entry(lhs, rhs, group_sizes, rhs_scale=rhs_scale, preferred_element_type=preferred_element_type,
                     implementation=implementation, interpret=interpret)

    return ragged_dot_quantized


def tpu_specs() -> list[OpSpec]:
    """What the torch-tpu build registers: each entry with the JAX package's TPU order, compiled by Mosaic."""
    order = jax_entry(__package__, "implementations_for")("tpu")
    return [OpSpec("ragged_dot", ragged_dot_function(order, False), DIFFERENTIABLE),
            OpSpec("ragged_dot_quantized", ragged_dot_quantized_function(order, False), QUANTIZED_DIFFERENTIABLE),
            *experts_forward_specs(order)]


def experts_forward_specs(order: Any) -> list[OpSpec]:
    """transformers' whole expert block (hf_experts.py experts_forward) as one op per call, with and without
    biases: moe/transformers_experts.py on the TPU order, compiled by Mosaic."""
    from .moe.transformers_experts import DIFFERENTIABLE as BLOCK
    from .moe.transformers_experts import DIFFERENTIABLE_BIAS, experts_function

    return [OpSpec("experts_forward", experts_function(False, order, False), BLOCK),
            OpSpec("experts_forward_bias", experts_function(True, order, False), DIFFERENTIABLE_BIAS)]


TPU_OPS = TpuOps("ragged_dot", VERSION, package_digest(Path(__file__).parent), tpu_specs)


def ragged_dot_jax(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *,
                   preferred_element_type: torch.dtype) -> torch.Tensor:
    """The JAX kernel on torch tensors (lhs and rhs in one dtype), differentiable through torch autograd."""
    sizes = group_sizes.to(torch.int32)
    if on_tpu(lhs, rhs, group_sizes):
        return TPU_OPS.get("ragged_dot")(lhs, rhs, sizes, preferred_element_type=preferred_element_type)
    return call_jax(ragged_dot_function(None, None), (lhs, rhs, sizes),
                    {"preferred_element_type": jax_dtype(preferred_element_type)}, differentiable=DIFFERENTIABLE)


def ragged_dot_quantized_jax(lhs: torch.Tensor, rhs: torch.Tensor, rhs_scale: torch.Tensor, group_sizes: torch.Tensor,
                             *, preferred_element_type: torch.dtype) -> torch.Tensor:
    """The JAX kernel on quantized weights (rhs int8 / float8_e4m3fn, rhs_scale float32; checked by the caller),
    differentiable in lhs through torch autograd."""
    sizes = group_sizes.to(torch.int32)
    if on_tpu(lhs, rhs, rhs_scale, group_sizes):
        return TPU_OPS.get("ragged_dot_quantized")(lhs, rhs, rhs_scale, sizes,
                                                   preferred_element_type=preferred_element_type)
    return call_jax(ragged_dot_quantized_function(None, None), (lhs, rhs, rhs_scale, sizes),
                    {"preferred_element_type": jax_dtype(preferred_element_type)},
                    differentiable=QUANTIZED_DIFFERENTIABLE)
