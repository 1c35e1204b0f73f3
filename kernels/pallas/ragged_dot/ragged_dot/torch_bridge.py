"""torch <-> JAX for the ragged dot: hand torch tensors to the JAX kernel without copying them.

CPU and CUDA: DLPack, zero-copy for contiguous f32/bf16 (non-contiguous inputs are made contiguous
first, the only copy). TPU: torch_tpu's `jax_op`, imported only when the tensors live on a TPU,
because importing torch_tpu on a machine without one aborts the process. jax is imported lazily so
this file can ship in the torch-cpu build, where jax may be absent.
"""

from __future__ import annotations

from typing import Any

import torch

from ._vendor.torch_jax import jax_entry, run_jax


def _forward(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, **kw: Any) -> torch.Tensor:
    fn = jax_entry(__package__, "ragged_dot")
    return run_jax(lambda a, b, g: fn(a, b, g, **kw), lhs, rhs, group_sizes.to(torch.int32))


def _grads(lhs, rhs, group_sizes, dout, **kw):
    """(d_lhs, d_rhs) through jax.vjp of the JAX entry (its custom_vjp supplies the kernels)."""
    import jax

    fn = jax_entry(__package__, "ragged_dot")

    def both(a, b, g, d):
        _, vjp = jax.vjp(lambda x, y: fn(x, y, g, **kw), a, b)
        return vjp(d)

    return run_jax(both, lhs, rhs, group_sizes.to(torch.int32), dout)


class _JaxRaggedDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, lhs, rhs, group_sizes, kw):  # type: ignore[override]
        ctx.save_for_backward(lhs, rhs, group_sizes)
        ctx.kw = kw
        return _forward(lhs, rhs, group_sizes, **kw)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        lhs, rhs, sizes = ctx.saved_tensors
        d_lhs, d_rhs = _grads(lhs, rhs, sizes, dout.contiguous(), **ctx.kw)
        return (
            d_lhs.to(lhs.dtype) if ctx.needs_input_grad[0] else None,
            d_rhs.to(rhs.dtype) if ctx.needs_input_grad[1] else None,
            None,
            None,
        )


def ragged_dot_jax(
    lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, **kw: Any
) -> torch.Tensor:
    """The JAX kernel on torch tensors, differentiable through torch autograd."""
    if torch.is_grad_enabled() and (lhs.requires_grad or rhs.requires_grad):
        return _JaxRaggedDot.apply(lhs, rhs, group_sizes, kw)
    return _forward(lhs.detach(), rhs.detach(), group_sizes, **kw)
