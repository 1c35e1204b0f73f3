"""torch <-> JAX for the torch-facing builds: a kernel's JAX entries as annotated functions, run on torch tensors.

One description serves two hand-overs. On CPU/CUDA (`call_jax`): DLPack, zero-copy for contiguous f32/bf16, with a
torch autograd Function whose backward is `vjp_function(forward)` (jax.vjp of the JAX entry, whose custom_vjp supplies
the Pallas backward kernels). On a TPU the same annotated functions become torch custom ops through torch_tpu's
`jax_op` (torch_tpu_ops.py), with the same vjp function as their backward op.

A forward function takes its tensors positionally (annotated `jax.Array`) and its static options keyword-only
(annotated bool/int/float/str/enum/dtype): the signature torch_tpu's `jax_op` infers a torch schema from. jax is
imported only when a tensor crosses over (this module ships in the torch-cpu builds, where jax may be absent);
torch_tpu never.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Sequence
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


def jax_dtype(dtype: torch.dtype) -> Any:
    """The JAX dtype of a torch floating or integer dtype (torch.bfloat16 -> bfloat16)."""
    import jax.numpy as jnp

    return jnp.dtype(str(dtype).removeprefix("torch."))


def run_jax(fn: Callable[..., Any], *tensors: torch.Tensor) -> Any:
    """fn (a JAX function) on torch tensors through DLPack (CPU/CUDA); torch tensors out."""
    out = fn(*(to_jax(t) for t in tensors))
    return tuple(to_torch(o) for o in out) if isinstance(out, tuple | list) else to_torch(out)


def jax_entry(package: str, name: str) -> Callable[..., Any]:
    """The JAX entry function `name` of the kernel package this bridge ships in (its api module), imported
    relatively so it resolves inside whichever build the bridge was loaded from."""
    return getattr(importlib.import_module(".api", package), name)


def _split(forward: Callable[..., Any]) -> tuple[list[inspect.Parameter], list[inspect.Parameter], int]:
    """(tensor parameters, static keyword-only parameters, number of outputs) of an annotated forward function."""
    sig = inspect.signature(forward, eval_str=True)
    params = list(sig.parameters.values())
    tensors = [p for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    statics = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    if len(tensors) + len(statics) != len(params):
        raise TypeError(f"{forward.__name__}: tensors positional, static options keyword-only, nothing else")
    ret = sig.return_annotation
    outputs = len(getattr(ret, "__args__", ())) if getattr(ret, "__origin__", None) is tuple else 1
    return tensors, statics, outputs


def vjp_function(forward: Callable[..., Any], differentiable: Sequence[int]) -> Callable[..., Any]:
    """The backward of an annotated forward function as another annotated JAX function:
    (*forward tensors, *output cotangents, *, statics) -> gradients of the tensors at `differentiable`, in order.

    jax.vjp of the forward, so a kernel's custom_vjp supplies its own backward kernels. The signature is written out
    (not *args) because torch_tpu's jax_op reads the torch schema off it."""
    import jax

    tensors, statics, outputs = _split(forward)
    diff = tuple(differentiable)
    bad = [i for i in diff if not 0 <= i < len(tensors)]
    if bad or not diff:
        raise ValueError(f"{forward.__name__}: differentiable positions {diff} must index its {len(tensors)} tensors")
    n = len(tensors)

    def backward(*arrays: Any, **options: Any) -> tuple[Any, ...]:
        primals, cotangents = list(arrays[:n]), arrays[n:]

        def at(*moving: Any) -> Any:
            args = list(primals)
            for i, m in zip(diff, moving, strict=True):
                args[i] = m
            return forward(*args, **options)

        _, pullback = jax.vjp(at, *(primals[i] for i in diff))
        return tuple(pullback(cotangents[0] if outputs == 1 else tuple(cotangents)))

    cot = [inspect.Parameter(f"grad_out{'' if outputs == 1 else i}", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                             annotation=jax.Array) for i in range(outputs)]
    backward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*tensors, *cot, *statics], return_annotation=tuple[(jax.Array,) * len(diff)])
    backward.__name__ = backward.__qualname__ = f"{forward.__name__}_backward"
    return backward


class _JaxCall(torch.autograd.Function):
    """A JAX forward on torch tensors (DLPack) with its vjp function as the backward."""

    @staticmethod
    def forward(ctx, forward, backward, differentiable, options, *tensors):  # type: ignore[override]
        ctx.save_for_backward(*tensors)
        ctx.backward, ctx.differentiable, ctx.options = backward, differentiable, options
        return run_jax(functools.partial(forward, **options), *tensors)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        tensors = ctx.saved_tensors
        out = run_jax(functools.partial(ctx.backward, **ctx.options), *tensors, *(g.contiguous() for g in grads))
        result: list[torch.Tensor | None] = [None] * len(tensors)
        for pos, g in zip(ctx.differentiable, out, strict=True):
            if ctx.needs_input_grad[4 + pos]:
                result[pos] = g.to(tensors[pos].dtype)
        return (None, None, None, None, *result)


#: One backward per (forward, differentiable positions): the bridges' forwards are built once (their *_function
#: builders are cached), so a training step does not re-inspect the signature and rebuild the vjp wrapper per call.
_cached_vjp = functools.cache(vjp_function)


def call_jax(forward: Callable[..., Any], tensors: Sequence[torch.Tensor], options: dict[str, Any], *,
             differentiable: Sequence[int] = ()) -> Any:
    """forward(*tensors, **options) through DLPack, differentiable through torch autograd in the tensors at
    `differentiable` when one of them requires grad (the backward is vjp_function(forward, differentiable))."""
    diff = tuple(differentiable)
    if diff and torch.is_grad_enabled() and any(tensors[i].requires_grad for i in diff):
        return _JaxCall.apply(forward, _cached_vjp(forward, diff), diff, options, *tensors)
    return run_jax(functools.partial(forward, **options), *(t.detach() for t in tensors))
