"""torch <-> JAX for flash attention: the package's JAX flash_attention on torch tensors.

CPU and CUDA: DLPack (zero-copy for contiguous tensors). TPU: torch_tpu's `jax_op`, imported only when
the tensors live on a TPU. jax is imported lazily so this file can ship in the torch-cpu build.
Gradients (q, k, v, sinks) come from jax.vjp of the JAX entry, whose custom VJP supplies the kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._vendor.torch_jax import jax_entry, run_jax


def _operands(q, k, v, sinks, q_lengths, kv_lengths) -> list[torch.Tensor]:
    b = q.shape[0]
    snk = torch.zeros(q.shape[1], dtype=torch.float32, device=q.device) if sinks is None else sinks.float()
    ql = torch.full((b,), q.shape[2], dtype=torch.int32, device=q.device) if q_lengths is None else q_lengths
    kl = torch.full((b,), k.shape[2], dtype=torch.int32, device=q.device) if kv_lengths is None else kv_lengths
    return [q, k, v, snk, ql.to(torch.int32), kl.to(torch.int32)]


def _bind(has_sinks: bool, kw: dict[str, Any]) -> Callable[..., Any]:
    fn = jax_entry(__package__, "flash_attention")

    def call(q, k, v, sinks, ql, kl):
        return fn(q, k, v, sinks=sinks if has_sinks else None, q_lengths=ql, kv_lengths=kl, **kw)

    return call


class _JaxFlash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, q_lengths, kv_lengths, has_sinks, kw):  # type: ignore[override]
        ctx.save_for_backward(q, k, v, sinks, q_lengths, kv_lengths)
        ctx.has_sinks, ctx.kw = has_sinks, kw
        return run_jax(_bind(has_sinks, kw), q, k, v, sinks, q_lengths, kv_lengths)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        import jax

        q, k, v, sinks, ql, kl = ctx.saved_tensors
        fn = _bind(ctx.has_sinks, ctx.kw)

        def grads(q, k, v, s, ql, kl, d):
            _, vjp = jax.vjp(lambda a, b, c, e: fn(a, b, c, e, ql, kl), q, k, v, s)
            return vjp(d)

        dq, dk, dv, ds = run_jax(grads, q, k, v, sinks, ql, kl, dout.contiguous())
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), ds if ctx.has_sinks else None,
                None, None, None, None)


def attention_jax(q, k, v, *, sinks=None, q_lengths=None, kv_lengths=None, **kw: Any) -> torch.Tensor:
    """The JAX flash_attention on torch tensors (kw: causal, sm_scale, sliding_window, logits_soft_cap)."""
    ops = _operands(q, k, v, sinks, q_lengths, kv_lengths)
    has_sinks = sinks is not None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v) + ((sinks,) if has_sinks else ())):
        out = _JaxFlash.apply(*ops, has_sinks, kw)
    else:
        out = run_jax(_bind(has_sinks, kw), *(t.detach() for t in ops))
    return out
