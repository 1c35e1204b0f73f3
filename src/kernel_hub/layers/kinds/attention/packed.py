"""Packed attention calls on a kernelized model: transformers' continuous batching (`generate_batch`, `transformers
serve --continuous-batching`) and padding-free batches, which hand the attention function many sequences packed into
one row with `cu_seq_lens_q` / `cu_seq_lens_k` and no mask.

Under a flash-named implementation (continuous batching accepts no other custom name) transformers builds no mask for
these calls, so they are read here the way its own flash wrapper reads them: packed keys (the cache gathered by
transformers) go to the kernel's `flash_attn_varlen_func`; a paged call (`block_table` with `k_cache` / `v_cache`, the
decode fast path) goes to its `flash_attn_with_kvcache`, which writes the new rows into their pages and reads the pages
in place. A layer kept on its previous implementation (or a call the kernel refuses) gets the mask that
implementation needs, block-diagonal and causal per sequence, built here from the same offsets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ....errors import KernelHubError

#: kwargs of a packed call: the per-sequence offsets of the queries and the keys.
OFFSETS = ("cu_seq_lens_q", "cu_seq_lens_k")
#: kwargs of a paged call (the decode fast path), beside the offsets.
PAGED = ("block_table", "k_cache", "v_cache")
#: What the previous implementation never gets: the packed call's own arguments, read here into a mask.
PACKED_KWARGS = (*OFFSETS, "max_length_q", "max_length_k", *PAGED)


@dataclass(frozen=True)
class PackedKernel:
    """The kernel's flash-attn functions for packed calls (None where this kernel version lacks one)."""

    varlen: Callable[..., torch.Tensor] | None
    kvcache: Callable[..., torch.Tensor] | None

    @classmethod
    def of(cls, kernel: object) -> PackedKernel:
        return cls(getattr(kernel, "flash_attn_varlen_func", None), getattr(kernel, "flash_attn_with_kvcache", None))


def is_packed(kwargs: Mapping[str, object]) -> bool:
    """Whether this attention call carries packed sequences (offsets for both queries and keys)."""
    return all(kwargs.get(name) is not None for name in OFFSETS)


def is_paged(kwargs: Mapping[str, object]) -> bool:
    return all(kwargs.get(name) is not None for name in PAGED)


def plan_packed(kernel: PackedKernel | None, kwargs: Mapping[str, object], *, training: bool) -> str:
    """Pure decision: why the kernel cannot serve this packed call ("" if it can)."""
    if kernel is None:
        return "layer kept on its previous implementation"
    if is_paged(kwargs) and kernel.kvcache is None:
        return "this kernel version has no flash_attn_with_kvcache (paged KV cache)"
    if not is_paged(kwargs) and kernel.varlen is None:
        return "this kernel version has no flash_attn_varlen_func"
    if kwargs.get("dropout", 0.0) and training:
        return "attention dropout"
    if kwargs.get("output_attentions"):
        return "output_attentions"
    return ""


def _causal(module: torch.nn.Module, kwargs: Mapping[str, object]) -> bool:
    causal = kwargs.get("is_causal")
    return bool(getattr(module, "is_causal", True)) if causal is None else bool(causal)


def kernel_packed(kernel: PackedKernel, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """The kernel on a packed call: query/key/value [1, H, T, D] -> [1, Tq, Hq, Dv] (transformers' flash layout)."""
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # [1, T, H, D]
    d, dv = q.shape[-1], v.shape[-1]
    if dv > d:
        raise KernelHubError(f"{type(module).__name__}: value head size {dv} above the query head size {d} in a packed "
                             "call; load the model with attn_implementation='sdpa' for continuous batching")
    if dv < d:  # multi-head latent attention: zero value columns add only output columns, dropped below
        v = torch.nn.functional.pad(v, (0, d - dv))
    scale = kwargs.get("scaling")
    softcap = kwargs.get("softcap") or 0.0
    sinks = kwargs.get("s_aux")
    sinks = None if sinks is None else sinks.float()
    causal = _causal(module, kwargs)
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    window = kwargs.get("sliding_window")
    if is_paged(kwargs):
        q, k, v = (x.reshape(-1, 1, *x.shape[-2:]) for x in (q, k, v))
        n = k.shape[0]  # one new token per sequence on the decode fast path
        cached = cu_k[1:n + 1] - cu_k[:n] - 1
        # the cache holds every earlier position, so the window always applies (flash-attn's (left, right) form)
        window_size = (-1, -1) if window is None else (int(window) - 1, int(window) - 1)
        out = kernel.kvcache(q, kwargs["k_cache"], kwargs["v_cache"], k, v, cache_seqlens=cached,
                             block_table=kwargs["block_table"], softmax_scale=scale, causal=causal,
                             window_size=window_size, softcap=softcap, s_aux=sinks)
        out = out.reshape(1, -1, *out.shape[-2:])
    else:
        window_size = (-1, -1) if window is None or k.shape[1] <= int(window) else (int(window) - 1, int(window) - 1)
        q, k, v = (x.reshape(-1, *x.shape[-2:]) for x in (q, k, v))
        lengths_q, lengths_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
        max_q = kwargs.get("max_length_q")
        max_k = kwargs.get("max_length_k")
        max_q = int(lengths_q.max()) if max_q is None else int(max_q)
        max_k = int(lengths_k.max()) if max_k is None else int(max_k)
        out = kernel.varlen(q, k, v, cu_seqlens_q=cu_q.to(torch.int32), cu_seqlens_k=cu_k.to(torch.int32),
                            max_seqlen_q=max(max_q, 1), max_seqlen_k=max(max_k, 1), softmax_scale=scale, causal=causal,
                            window_size=window_size, softcap=softcap, s_aux=sinks)
        out = out.reshape(1, -1, *out.shape[-2:])
    return out[..., :dv] if dv < d else out


def packed_mask(tq: int, tk: int, cu_q: torch.Tensor, cu_k: torch.Tensor, *, causal: bool, window: int | None,
                device: torch.device) -> torch.Tensor:
    """Bool [1, 1, tq, tk]: query row i of sequence s sees key j of sequence s (bottom-right causal, sliding window);
    rows and columns no sequence owns see nothing."""
    cu_q, cu_k = cu_q.long().to(device), cu_k.long().to(device)
    if cu_q.shape[0] < 2:
        return torch.zeros(1, 1, tq, tk, dtype=torch.bool, device=device)
    rows, cols = torch.arange(tq, device=device), torch.arange(tk, device=device)
    seq_q = torch.searchsorted(cu_q[1:], rows, right=True)  # sequence of each row (len(cu)-1 past the last)
    seq_k = torch.searchsorted(cu_k[1:], cols, right=True)
    n = cu_q.shape[0] - 1
    own_q, own_k = seq_q < n, seq_k < n
    seq_q, seq_k = seq_q.clamp(max=max(n - 1, 0)), seq_k.clamp(max=max(n - 1, 0))
    lengths_q, lengths_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    pos_q = rows - cu_q[seq_q] + (lengths_k - lengths_q)[seq_q]  # the new tokens are each sequence's last keys
    pos_k = cols - cu_k[seq_k]
    keep = own_q[:, None] & own_k[None, :] & (seq_q[:, None] == seq_k[None, :])
    if causal:
        keep &= pos_k[None, :] <= pos_q[:, None]
    if window is not None:
        keep &= pos_k[None, :] > pos_q[:, None] - window
    return keep[None, None]


def previous_packed(prev_fn: Callable[..., tuple[torch.Tensor, torch.Tensor | None]], module: torch.nn.Module,
                    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kwargs: dict[str, Any], *,
                    additive: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The previous implementation on a packed call, with the mask it needs (additive for eager attention)."""
    if is_paged(kwargs):
        raise KernelHubError(f"{type(module).__name__} is kept on its previous implementation, which cannot read "
                             "transformers' paged KV cache (block_table); turn the decode fast path off "
                             "(ContinuousBatchingConfig(max_blocks_per_request=0)) or kh.restore(model)")
    window = kwargs.get("sliding_window")
    mask = packed_mask(query.shape[2], key.shape[2], kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"],
                       causal=_causal(module, kwargs), window=None if window is None else int(window),
                       device=query.device)
    if additive:
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~mask, torch.finfo(query.dtype).min)
    rest = {k: v for k, v in kwargs.items() if k not in PACKED_KWARGS}
    return prev_fn(module, query, key, value, mask, **rest)
