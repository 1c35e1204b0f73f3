"""torch <-> JAX for flash attention: the package's JAX flash_attention, decode_attention and ragged_paged_attention on
torch tensors.

One annotated JAX function per entry serves both hand-overs. CPU and CUDA: DLPack (torch_jax.call_jax). TPU tensors:
the torch ops `kernel_hub_flash_attention_<version, digest>::flash_attention` and `::decode_attention` that jax_op
registers from the same functions with the TPU order ("pallas", then "xla") and interpret=False (Mosaic), once per
process (torch_tpu_ops.TpuOps); `::ragged_paged_attention` too where the JAX package has that entry. Prefill
gradients (q, k, v, sinks) come from jax.vjp of the entry on both paths (its custom VJP supplies the Pallas backward
kernels); decode and ragged paged attention are forward only. Imported only when the "jax" implementation
runs (it imports jax): the torch-cpu build never imports it.
"""

from __future__ import annotations

import functools
import importlib
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


def has_ragged_paged() -> bool:
    """Whether this build's JAX package has the ragged paged attention entry."""
    return hasattr(importlib.import_module(".paged", __package__), "ragged_paged_attention")


@functools.cache  # one function per option pair
def ragged_paged_function(implementation: Any, interpret: Any) -> Any:
    """The JAX ragged_paged_attention annotated for jax_op (forward only). It returns the attention output alone: the
    torch side has written the new rows into the caches already (they are views transformers shares, updated in
    place), so the kernel is told not to write them (update_cache=False: no aliased write, hence no copy of a cache
    the op does not own). num_seqs is a [1] int32 tensor."""
    entry = importlib.import_module(".paged", __package__).ragged_paged_attention

    def ragged_paged_attention(queries: jax.Array, keys: jax.Array, values: jax.Array, k_cache: jax.Array,
                               v_cache: jax.Array, kv_lens: jax.Array, page_indices: jax.Array, cu_q_lens: jax.Array,
                               num_seqs: jax.Array, sinks: jax.Array, *, has_sinks: bool, causal: bool,
                               sm_scale: float, sliding_window: int | None, soft_cap: float | None) -> jax.Array:
        out, _, _ = entry(queries, keys, values, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, num_seqs[0],
                          sinks=sinks if has_sinks else None, sm_scale=sm_scale, sliding_window=sliding_window,
                          soft_cap=soft_cap, causal=causal, implementation=implementation, interpret=interpret,
                          update_cache=False)
        return out

    return ragged_paged_attention


def tpu_specs() -> list[OpSpec]:
    """What the torch-tpu build registers: each entry with the JAX package's TPU order, compiled by Mosaic."""
    order = jax_entry(__package__, "implementations_for")("tpu")
    specs = [OpSpec("flash_attention", flash_attention_function(order, False), DIFFERENTIABLE),
             OpSpec("decode_attention", decode_attention_function(order, False))]
    if has_ragged_paged():
        specs.append(OpSpec("ragged_paged_attention", ragged_paged_function(order, False)))
    return specs


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


def ragged_paged_jax(queries, keys, values, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, num_seqs, *,
                     causal: bool, sm_scale: float, sliding_window: int | None, soft_cap: float | None,
                     sinks=None) -> torch.Tensor:
    """The JAX ragged_paged_attention on torch tensors -> out [T, Hq, D]. The call is checked and the new rows written
    into the torch caches here (in place, as the torch path does); the kernel then reads the pages. Forward only;
    NotImplementedError (the dispatch takes the next implementation) where the JAX package lacks the entry."""
    from .torch_paged import check_paged_call, read_new_rows, write_new_rows

    if not has_ragged_paged():
        raise NotImplementedError("this build's JAX package has no ragged_paged_attention")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (queries, keys, values, sinks)):
        raise NotImplementedError("the JAX ragged_paged_attention is forward only and these tensors require grad")
    call = check_paged_call(queries, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, num_seqs)
    if keys is not None:
        write_new_rows(k_cache, v_cache, keys, values, page_indices, call)
    tokens = queries.shape[0]
    rows_k = read_new_rows(k_cache, page_indices, call, tokens).to(queries.dtype)
    rows_v = read_new_rows(v_cache, page_indices, call, tokens).to(queries.dtype)
    count = kv_lens.shape[0] if num_seqs is None else int(num_seqs)
    tensors = (queries, rows_k, rows_v, k_cache, v_cache, kv_lens.to(torch.int32), page_indices.to(torch.int32),
               cu_q_lens.to(torch.int32), torch.tensor([count], dtype=torch.int32, device=queries.device),
               _sinks(sinks, queries.shape[1], queries.device))
    options = dict(has_sinks=sinks is not None, causal=causal, sm_scale=sm_scale, sliding_window=sliding_window,
                   soft_cap=soft_cap)
    if on_tpu(queries, k_cache, v_cache, sinks):
        return TPU_OPS.get("ragged_paged_attention")(*tensors, **options)
    return call_jax(ragged_paged_function(None, None), tensors, options)
