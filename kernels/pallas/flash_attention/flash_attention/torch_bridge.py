"""torch <-> JAX for flash attention: the package's JAX flash_attention and decode_attention on torch tensors.

One annotated JAX function per entry serves both hand-overs. CPU and CUDA: DLPack (torch_jax.call_jax). TPU tensors:
the torch ops `kernel_hub_flash_attention_<version, digest>::flash_attention` and `::decode_attention` that jax_op
registers from the same functions with the TPU order ("pallas", then "xla") and interpret=False (Mosaic), once per
process (torch_tpu_ops.TpuOps). Prefill gradients (q, k, v, sinks) come from jax.vjp of the entry on both paths (its
custom VJP supplies the Pallas backward kernels); decode is forward only. Imported only when the "jax" implementation
runs (it imports jax): the torch-cpu build never imports it.
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

#: q, k, v and sinks get gradients; the lengths (integers) do not.
DIFFERENTIABLE = (0, 1, 2, 3)


@functools.cache  # one forward per option pair: call_jax caches its backward by it
def flash_attention_function(implementation: Any, interpret: Any) -> Any:
    """The JAX flash_attention with the contract's options fixed, annotated for torch_tpu's jax_op: every tensor
    always present (sinks zeros and has_sinks=False when absent, lengths full when absent), options keyword-only."""
    entry = jax_entry(__package__, "flash_attention")

    def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, sinks: jax.Array, q_lengths: jax.Array,
                        kv_lengths: jax.Array, *, causal: bool, has_sinks: bool, sm_scale: float,
                        sliding_window: int | None, logits_soft_cap: float | None) -> jax.Array:
        return entry(q, k, v, sinks=sinks if has_sinks else None, q_lengths=q_lengths, kv_lengths=kv_lengths,
                     causal=causal, sm_scale=sm_scale, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                     implementation=implementation, interpret=interpret)

    return flash_attention


@functools.cache  # one forward per option pair: call_jax caches its backward by it
def decode_attention_function(implementation: Any, interpret: Any) -> Any:
    """The JAX decode_attention, annotated the same way (forward only)."""
    entry = jax_entry(__package__, "decode_attention")

    def decode_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, kv_lengths: jax.Array,
                         sinks: jax.Array, *, has_sinks: bool, sm_scale: float, sliding_window: int | None,
                         logits_soft_cap: float | None) -> jax.Array:
        return entry(q, k_cache, v_cache, kv_lengths, sinks=sinks if has_sinks else None, sm_scale=sm_scale,
                     sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, implementation=implementation,
                     interpret=interpret)

    return decode_attention


def tpu_specs() -> list[OpSpec]:
    """What the torch-tpu build registers: each entry with the JAX package's TPU order, compiled by Mosaic."""
    order = jax_entry(__package__, "implementations_for")("tpu")
    return [OpSpec("flash_attention", flash_attention_function(order, False), DIFFERENTIABLE),
            OpSpec("decode_attention", decode_attention_function(order, False))]


TPU_OPS = TpuOps("flash_attention", VERSION, package_digest(Path(__file__).parent), tpu_specs)


def _sinks(sinks: torch.Tensor | None, heads: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(heads, dtype=torch.float32, device=device) if sinks is None else sinks.float()


def _lengths(lengths: torch.Tensor | None, batch: int, full: int, device: torch.device) -> torch.Tensor:
    return torch.full((batch,), full, dtype=torch.int32, device=device) if lengths is None else lengths.to(torch.int32)


def attention_jax(q, k, v, *, sinks=None, q_lengths=None, kv_lengths=None, causal: bool, sm_scale: float,
                  sliding_window: int | None, logits_soft_cap: float | None) -> torch.Tensor:
    """The JAX flash_attention on torch tensors, differentiable in q, k, v and sinks."""
    b = q.shape[0]
    tensors = (q, k, v, _sinks(sinks, q.shape[1], q.device), _lengths(q_lengths, b, q.shape[2], q.device),
               _lengths(kv_lengths, b, k.shape[2], q.device))
    options = dict(causal=causal, has_sinks=sinks is not None, sm_scale=sm_scale, sliding_window=sliding_window,
                   logits_soft_cap=logits_soft_cap)
    if on_tpu(q, k, v, sinks):
        return TPU_OPS.get("flash_attention")(*tensors, **options)
    return call_jax(flash_attention_function(None, None), tensors, options, differentiable=DIFFERENTIABLE)


def decode_jax(q, k_cache, v_cache, kv_lengths, *, sinks=None, sm_scale: float, sliding_window: int | None,
               logits_soft_cap: float | None) -> torch.Tensor:
    """The JAX decode_attention on torch tensors; forward only, so a call that needs gradients is refused
    (NotImplementedError: the dispatch then takes the next implementation, the differentiable torch-native one)."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k_cache, v_cache, sinks)):
        raise NotImplementedError("the JAX decode_attention is forward only and these tensors require grad")
    tensors = (q, k_cache, v_cache, _lengths(kv_lengths, q.shape[0], k_cache.shape[2], q.device),
               _sinks(sinks, q.shape[1], q.device))
    options = dict(has_sinks=sinks is not None, sm_scale=sm_scale, sliding_window=sliding_window,
                   logits_soft_cap=logits_soft_cap)
    if on_tpu(q, k_cache, v_cache, sinks):
        return TPU_OPS.get("decode_attention")(*tensors, **options)
    return call_jax(decode_attention_function(None, None), tensors, options)
