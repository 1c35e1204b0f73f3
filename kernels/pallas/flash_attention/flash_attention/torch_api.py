"""Torch-facing entry of the flash-attention kernel (the package __init__ of the torch-* builds).

`flash_attention(q[B,Hq,Sq,D], k[B,Hkv,Skv,D], v, ...)` has the JAX entry's contract on torch tensors:
bottom-right causal alignment, sliding window, logits soft-cap, sinks in the softmax denominator,
per-sequence q/kv lengths, rows with nothing to attend = 0. `decode_attention(q[B,Hq,D], k_cache, v_cache,
kv_lengths, ...)` is the JAX decode entry: one new query per sequence, its own key last in the cache.
The kernel contract's `implementation=` (docs/kernel-contract.md): on CPU torch-native first (torch_cpu.py;
jax is never imported, so the torch-cpu build runs where only torch is installed); elsewhere the JAX package
function first (torch_bridge.py): through DLPack on CUDA, as the TorchTPU ops
`kernel_hub_flash_attention_<version, digest>::flash_attention` / `::decode_attention` on TPU tensors (the torch-tpu
build's entry, torch_tpu_api.py, registers them). Prefill is differentiable on both; the JAX decode is forward
only, so a decode call that needs gradients runs torch-native. `flash_attn_func` / `flash_attn_varlen_func` are
flash-attn's interface (flash_attn_api.py), what transformers' hub attention loads for
`attn_implementation="kernel-hub/flash-attention-tpu"`, with `flash_attn_with_kvcache` and `block_table` for a paged KV
cache (transformers' continuous batching); `ragged_paged_attention(queries, keys, values, k_cache, v_cache, kv_lens,
page_indices, cu_q_lens, ...)` is the JAX contract's paged entry on torch tensors (torch_paged.py natively, the JAX
kernel through the bridge); `attention_forward` is an AttentionInterface function for hand
registration (hf_attention.py); `layers` is HF kernels' layer module: empty, and it says why (no transformers hub layer
name is softmax attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from . import layers
from ._vendor.shapes import check_attention
from ._vendor.torch_dispatch import IMPLEMENTATIONS, ORDER, TorchDispatch
from ._vendor.torch_tpu_ops import op_namespace, package_digest
from .flash_attn_api import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from .hf_attention import UnsupportedAttentionCall, attention_forward
from .paged_args import soft_cap_arg, window_arg
from .release import VERSION
from .torch_cpu import attention_torch
from .torch_paged import PagedCacheError, ragged_paged_attention_torch

__all__ = [
    "IMPLEMENTATIONS",
    "ORDER",
    "PagedCacheError",
    "UnsupportedAttentionCall",
    "attention_forward",
    "decode_attention",
    "describe",
    "flash_attention",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "implementations_for",
    "last_implementation",
    "layers",
    "ragged_paged_attention",
    "resolve_implementation",
]

_NAMESPACE = op_namespace("flash_attention", VERSION, package_digest(Path(__file__).parent))
#: One dispatch for both entries, as on the JAX side: last_implementation() reports whichever ran last.
_DISPATCH = TorchDispatch("flash_attention", native=lambda: "torch-native masked attention (f32 softmax)",
                          tpu_op=f"{_NAMESPACE}::flash_attention")
#: Every dispatch of this entry (the torch-tpu build's entry hooks its device notice into each).
DISPATCHES = (_DISPATCH,)
implementations_for, resolve_implementation, last_implementation, describe = _DISPATCH.exports()


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    q_lengths: torch.Tensor | None = None,
    kv_lengths: torch.Tensor | None = None,
    implementation: str | Sequence[str] | None = None,
) -> torch.Tensor:
    """Attention of q[B,Hq,Sq,D] over k, v [B,Hkv,Skv,D] -> [B,Hq,Sq,D] in q's dtype (see the JAX entry).

    implementation: "torch" (native) or "jax" (the Pallas/XLA kernel through the bridge), a name or a sequence
    tried in order; None: implementations_for(q.device).
    """
    window, scale, cap = check_attention(q.shape, k.shape, v.shape, sliding_window=sliding_window, sm_scale=sm_scale,
                                         logits_soft_cap=logits_soft_cap)

    def call(name: str) -> torch.Tensor:
        if name == "torch":
            return attention_torch(q, k, v, causal=bool(causal), sm_scale=scale, sliding_window=window,
                                   logits_soft_cap=cap, sinks=sinks, q_lengths=q_lengths, kv_lengths=kv_lengths)
        from .torch_bridge import attention_jax

        return attention_jax(q, k, v, sinks=sinks, q_lengths=q_lengths, kv_lengths=kv_lengths, causal=bool(causal),
                             sm_scale=scale, sliding_window=window, logits_soft_cap=cap)

    return _DISPATCH.run(q.device, implementation, call, entry="flash_attention")


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_lengths: torch.Tensor,
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    implementation: str | Sequence[str] | None = None,
) -> torch.Tensor:
    """One new query per sequence, q[B,Hq,D], against caches [B,Hkv,S,D] holding kv_lengths[B] valid positions
    (the query's own key included, last) -> [B,Hq,D] in q's dtype (see the JAX decode_attention)."""
    window, scale, cap = check_attention(q.shape, k_cache.shape, v_cache.shape, sliding_window=sliding_window,
                                         sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, decode=True)

    def call(name: str) -> torch.Tensor:
        if name == "torch":  # the one query sits at its sequence's last valid position: causal, bottom-right
            ones = torch.ones(q.shape[0], dtype=torch.int32, device=q.device)
            return attention_torch(q[:, :, None], k_cache, v_cache, causal=True, sm_scale=scale,
                                   sliding_window=window, logits_soft_cap=cap, sinks=sinks, q_lengths=ones,
                                   kv_lengths=kv_lengths)[:, :, 0]
        from .torch_bridge import decode_jax

        return decode_jax(q, k_cache, v_cache, kv_lengths, sinks=sinks, sm_scale=scale, sliding_window=window,
                          logits_soft_cap=cap)

    return _DISPATCH.run(q.device, implementation, call, entry="decode_attention")


def ragged_paged_attention(
    queries: torch.Tensor,
    keys: torch.Tensor | None,
    values: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_lens: torch.Tensor,
    page_indices: torch.Tensor,
    cu_q_lens: torch.Tensor,
    num_seqs: int | None = None,
    *,
    sinks: torch.Tensor | None = None,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    causal: bool = True,
    implementation: str | Sequence[str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The JAX entry's ragged paged attention on torch tensors -> (out [T, Hq, D], k_cache, v_cache).

    queries [T, Hq, D] and keys/values [T, Hkv, D] packed per sequence by cu_q_lens [S+1]; k_cache/v_cache
    [num_pages, page_size, Hkv, D]; kv_lens [S] include the new tokens; page_indices [S, pages_per_seq]. The new rows
    are written into their pages in place (keys/values None: the caches hold them already), and the same cache
    tensors are returned. Bad page tables or lengths raise PagedCacheError before anything is written.
    """
    if queries.dim() != 3:
        raise PagedCacheError(f"ragged_paged_attention: queries of shape {tuple(queries.shape)}: expected packed "
                              "[tokens, q_heads, head_dim]")
    try:
        window = window_arg("ragged_paged_attention", sliding_window)
        cap = soft_cap_arg("ragged_paged_attention", soft_cap)
    except ValueError as e:
        raise PagedCacheError(str(e)) from None
    scale = float(sm_scale) if sm_scale is not None else queries.shape[-1] ** -0.5

    def call(name: str) -> torch.Tensor:
        if name == "torch":
            return ragged_paged_attention_torch(queries, keys, values, k_cache, v_cache, kv_lens, page_indices,
                                                cu_q_lens, num_seqs, causal=bool(causal), sm_scale=scale,
                                                sliding_window=window, soft_cap=cap, sinks=sinks)
        from .torch_bridge import ragged_paged_jax

        return ragged_paged_jax(queries, keys, values, k_cache, v_cache, kv_lens, page_indices, cu_q_lens, num_seqs,
                                causal=bool(causal), sm_scale=scale, sliding_window=window, soft_cap=cap, sinks=sinks)

    out = _DISPATCH.run(queries.device, implementation, call, entry="ragged_paged_attention")
    return out, k_cache, v_cache
