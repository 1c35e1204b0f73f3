"""flash-attn's interface on this kernel, `flash_attn_func`, `flash_attn_varlen_func` and `flash_attn_with_kvcache`:
transformers' hub attention, and its continuous batching's paged KV cache.

transformers loads a hub repo named in `attn_implementation="org/repo"` whose name says "flash" as a flash-attn
package: it reads these two functions (their parameters decide which options it passes), unpads left- or right-padded
batches into one packed sequence with `cu_seqlens`, and calls the varlen function (the plain one when nothing is
padding). Both keep flash-attn 2's signatures and meaning and run this package's `flash_attention` (so the build's one
dispatch runs them: torch-native on CPU, the Pallas kernel through the TorchTPU op on TPU tensors):
- q [B, Sq, Hq, D], k/v [B, Skv, Hkv, D] (varlen: q [total_q, Hq, D], k/v [total_k, Hkv, D] with cu_seqlens_q/k
  [batch + 1] int32 offsets), Hq a multiple of Hkv (GQA/MQA without repeating K/V); the output has q's shape.
- causal masks bottom-right when Sq != Skv (flash-attn >= 2.1); window_size=(left, right), -1 unbounded: key j is seen
  by query i when i + Skv - Sq - left <= j <= i + Skv - Sq + right; under causal `right` is 0 whatever is passed.
- softcap: logits -> softcap * tanh(logits / softcap), 0 off (an infinite, NaN or negative one is refused);
  softmax_scale: default 1/sqrt(D).
- Lengths, offsets and block tables keep their integer dtype through the checks (an int64 page id past the cache
  is refused, never cut to int32 first); float lengths are refused.
- s_aux: attention sinks [Hq] (GPT-OSS; vLLM's flash-attn 3 name, the one transformers 5.25 passes when the function
  takes it): one extra logit per head in the softmax denominator with no value.
- A query row with no key to attend comes out 0 (as flash-attn's).
- Paged KV cache (flash-attn >= 2.5; transformers' continuous batching): `flash_attn_with_kvcache(q, k_cache, v_cache,
  k, v, cache_seqlens=, block_table=)` writes the new k/v rows into their pages (in place) and attends; with
  `block_table` (or vLLM's name `page_table`) `flash_attn_varlen_func` takes k/v as the caches [num_pages, page_size,
  Hkv, D] and cu_seqlens_k (or `seqused_k`) as each sequence's cached length. Both walk the pages (torch_paged.py): the
  cache is never gathered into one contiguous copy. On TPU tensors the torch-tpu build runs the JAX ragged paged
  attention kernel.
Refused with `UnsupportedAttentionCall` naming what to change (never computed approximately): dropout_p != 0,
return_attn_probs=True, alibi_slopes, and a bounded right window without causal that is not 0 (the kernel masks
keys on the left only).
"""

from __future__ import annotations

from typing import Any

import torch

from .hf_attention import UnsupportedAttentionCall
from .paged_args import int_arg, soft_cap_arg

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]

_WHO = "kernel-hub/flash-attention-tpu"


def _refuse(function: str, what: str) -> UnsupportedAttentionCall:
    return UnsupportedAttentionCall(f"{_WHO} {function}: {what}")


def mask_options(function: str, *, causal: bool, window_size: tuple[int, int], max_seqlen_q: int,
                 dropout_p: float, alibi_slopes: Any, return_attn_probs: bool) -> tuple[bool, int | None]:
    """flash-attn's (causal, window_size) as the kernel's (causal, sliding_window), or the refusal saying why not.

    A right bound of 0 is the causal mask itself; a right bound of at least max_seqlen_q - 1 masks nothing."""
    if dropout_p:
        raise _refuse(function, f"dropout_p={dropout_p}: the kernel has no attention dropout; pass 0.0 (model.eval())")
    if return_attn_probs:
        raise _refuse(function, "return_attn_probs=True: the kernel never forms the attention matrix; pass False "
                                "(or use attn_implementation='eager' to read attention weights)")
    if alibi_slopes is not None:
        raise _refuse(function, "alibi_slopes: the kernel has no ALiBi bias; pass None")
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise _refuse(function, f"window_size={window_size!r}: expected a pair (left, right) of ints, -1 unbounded"
                      ) from None
    if not causal and right == 0:
        causal = True
    if not causal and 0 < right < max_seqlen_q - 1:
        raise _refuse(function, f"window_size right={right} without causal: the kernel bounds keys on the left only; "
                                "pass right=-1 or causal=True")
    return causal, (None if left < 0 else left + 1)


def _sinks(s_aux: torch.Tensor | None, heads: int, function: str) -> torch.Tensor | None:
    if s_aux is None:
        return None
    if tuple(s_aux.shape) != (heads,):
        raise _refuse(function, f"s_aux of shape {tuple(s_aux.shape)}: expected one sink logit per query head "
                                f"({heads},)")
    return s_aux.float()


def _soft_cap(softcap: float | None, function: str) -> float | None:
    """flash-attn's softcap (0 or None: no cap) as the kernel's, or the refusal of an infinite, NaN or negative one."""
    try:
        return soft_cap_arg(function, softcap, name="softcap", zero_is_none=True)
    except ValueError as e:
        raise _refuse(function, str(e).removeprefix(f"{function}: ")) from None


def _index_tensor(t: torch.Tensor, name: str, function: str) -> torch.Tensor:
    """An integer tensor of lengths or offsets as int64, its values unchanged (never cut to int32 before the checks)."""
    if not isinstance(t, torch.Tensor) or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        what = f"dtype {t.dtype}" if isinstance(t, torch.Tensor) else f"a {type(t).__name__}"
        raise _refuse(function, f"{name} of {what}: expected an integer tensor")
    return t.long()


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: float | None = None, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                    softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                    return_attn_probs: bool = False, s_aux: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q [B, Sq, Hq, D] over k/v [B, Skv, Hkv, D] -> [B, Sq, Hq, D] in q's dtype (flash-attn's meaning;
    `deterministic` is accepted and moot: the forward is deterministic)."""
    from . import flash_attention

    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise _refuse("flash_attn_func", f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                                         "[batch, seqlen, heads, head_dim] each")
    causal, window = mask_options("flash_attn_func", causal=bool(causal), window_size=window_size,
                                  max_seqlen_q=q.shape[1], dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                                  return_attn_probs=return_attn_probs)
    out = flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                          sm_scale=softmax_scale, sliding_window=window,
                          logits_soft_cap=_soft_cap(softcap, "flash_attn_func"),
                          sinks=_sinks(s_aux, q.shape[2], "flash_attn_func"))
    return out.transpose(1, 2).contiguous()


def _lengths(cu_seqlens: torch.Tensor, total: int, name: str) -> torch.Tensor:
    """Per-sequence lengths from cumulative offsets, checked: int, 1-D, from 0, non-decreasing, within `total`."""
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.dtype.is_floating_point:
        raise _refuse("flash_attn_varlen_func", f"{name} of shape {tuple(cu_seqlens.shape)} and dtype "
                                                f"{cu_seqlens.dtype}: expected [batch + 1] integer offsets")
    cu = cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or bool((lengths < 0).any()) or int(cu[-1]) > total:
        raise _refuse("flash_attn_varlen_func", f"{name}={cu.tolist()}: offsets must start at 0, never decrease "
                                                f"and end within the {total} packed rows")
    return lengths


def _pad(packed: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """packed [total, H, D] -> [B, H, width, D], sequence b's rows first in its row, zeros after."""
    pos = torch.arange(width, device=packed.device)
    valid = pos[None] < lengths[:, None]  # [B, width]
    index = torch.where(valid, starts[:, None] + pos[None], 0)
    rows = packed[index.reshape(-1)].reshape(len(lengths), width, *packed.shape[1:])
    rows = rows.masked_fill(~valid[:, :, None, None], 0)
    return rows.transpose(1, 2)


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                           return_attn_probs: bool = False, s_aux: torch.Tensor | None = None,
                           block_table: torch.Tensor | None = None, page_table: torch.Tensor | None = None,
                           seqused_k: torch.Tensor | None = None) -> torch.Tensor:
    """Attention per packed sequence: q [total_q, Hq, D], k/v [total_k, Hkv, D], sequence b's queries at rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1] and its keys at cu_seqlens_k[b]:cu_seqlens_k[b+1] -> [total_q, Hq, D] in q's
    dtype (rows past cu_seqlens_q[-1] come out 0). The sequences run as one batch padded to max_seqlen_q/k with their
    lengths, so no sequence sees another's keys.

    Paged (block_table or page_table [batch, pages_per_seq] given): k/v are the caches [num_pages, page_size, Hkv, D]
    holding every key already, sequence b's length is cu_seqlens_k[b+1] - cu_seqlens_k[b] (or seqused_k[b]), and its
    queries are its last positions (bottom-right causal)."""
    from . import flash_attention

    name = "flash_attn_varlen_func"
    if block_table is not None or page_table is not None:
        return _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                             block_table if block_table is not None else page_table, dropout_p=dropout_p,
                             softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                             alibi_slopes=alibi_slopes, return_attn_probs=return_attn_probs, s_aux=s_aux,
                             max_seqlen_q=int(max_seqlen_q))
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise _refuse(name, f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected packed "
                            "[total_tokens, heads, head_dim] each")
    lq, lk = _lengths(cu_seqlens_q, q.shape[0], "cu_seqlens_q"), _lengths(cu_seqlens_k, k.shape[0], "cu_seqlens_k")
    if lq.shape != lk.shape:
        raise _refuse(name, f"cu_seqlens_q holds {len(lq)} sequences, cu_seqlens_k {len(lk)}")
    width_q, width_k = int(max_seqlen_q), int(max_seqlen_k)
    if int(lq.max()) > width_q or int(lk.max()) > width_k:
        raise _refuse(name, f"max_seqlen_q={width_q}, max_seqlen_k={width_k} below the longest sequences "
                            f"({int(lq.max())}, {int(lk.max())})")
    causal, window = mask_options(name, causal=bool(causal), window_size=window_size, max_seqlen_q=width_q,
                                  dropout_p=dropout_p, alibi_slopes=alibi_slopes, return_attn_probs=return_attn_probs)
    starts_q, starts_k = cu_seqlens_q[:-1].long(), cu_seqlens_k[:-1].long()
    padded = flash_attention(_pad(q, starts_q, lq, width_q), _pad(k, starts_k, lk, width_k),
                             _pad(v, starts_k, lk, width_k), causal=causal, sm_scale=softmax_scale,
                             sliding_window=window, logits_soft_cap=_soft_cap(softcap, name),
                             sinks=_sinks(s_aux, q.shape[1], name), q_lengths=lq.to(torch.int32),
                             kv_lengths=lk.to(torch.int32))  # [B, Hq, width_q, D]
    pos = torch.arange(width_q, device=q.device)
    valid = (pos[None] < lq[:, None]).reshape(-1)
    rows = (starts_q[:, None] + pos[None]).reshape(-1)[valid]
    out = q.new_zeros(q.shape)
    out[rows] = padded.transpose(1, 2).reshape(-1, *q.shape[1:])[valid]
    return out


def _scale(softmax_scale: float | None, head_dim: int) -> float:
    return float(softmax_scale) if softmax_scale is not None else head_dim ** -0.5


def _paged_varlen(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
                  cu_seqlens_k: torch.Tensor | None, seqused_k: torch.Tensor | None, table: torch.Tensor, *,
                  max_seqlen_q: int, **options: Any) -> torch.Tensor:
    """flash_attn_varlen_func over a paged cache that already holds every key (nothing is written)."""
    from . import ragged_paged_attention

    name = "flash_attn_varlen_func"
    if q.dim() != 3 or k_cache.dim() != 4:
        raise _refuse(name, f"q {tuple(q.shape)}, k {tuple(k_cache.shape)}: with a block table expected packed q "
                            "[total_q, heads, head_dim] and caches [num_pages, page_size, kv_heads, head_dim]")
    if seqused_k is not None:
        kv_lens = _index_tensor(seqused_k, "seqused_k", name)
    elif cu_seqlens_k is not None:
        cu_k = _index_tensor(cu_seqlens_k, "cu_seqlens_k", name)
        if cu_k.dim() != 1 or cu_k.numel() < 1:
            raise _refuse(name, f"cu_seqlens_k of shape {tuple(cu_k.shape)}: expected [batch + 1] offsets")
        kv_lens = cu_k[1:] - cu_k[:-1]
    else:
        raise _refuse(name, "a block table needs each sequence's cached length: pass cu_seqlens_k or seqused_k")
    causal, window = mask_options(name, causal=bool(options["causal"]), window_size=options["window_size"],
                                  max_seqlen_q=max_seqlen_q, dropout_p=options["dropout_p"],
                                  alibi_slopes=options["alibi_slopes"], return_attn_probs=options["return_attn_probs"])
    out, _, _ = ragged_paged_attention(q, None, None, k_cache, v_cache, kv_lens, table,
                                       _index_tensor(cu_seqlens_q, "cu_seqlens_q", name), num_seqs=int(table.shape[0]),
                                       sinks=_sinks(options["s_aux"], q.shape[1], name),
                                       sm_scale=_scale(options["softmax_scale"], q.shape[-1]), sliding_window=window,
                                       soft_cap=_soft_cap(options["softcap"], name), causal=causal)
    return out


def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            k: torch.Tensor | None = None, v: torch.Tensor | None = None,
                            rotary_cos: torch.Tensor | None = None, rotary_sin: torch.Tensor | None = None,
                            cache_seqlens: int | torch.Tensor | None = None,
                            cache_batch_idx: torch.Tensor | None = None, cache_leftpad: torch.Tensor | None = None,
                            block_table: torch.Tensor | None = None, softmax_scale: float | None = None,
                            causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: torch.Tensor | None = None,
                            num_splits: int = 0, return_softmax_lse: bool = False,
                            s_aux: torch.Tensor | None = None) -> torch.Tensor:
    """flash-attn's decode-with-cache call: q [B, Sq, Hq, D] against a KV cache, the new k/v [B, Sq, Hkv, D] written
    into it first (in place) at positions cache_seqlens[b] .. cache_seqlens[b] + Sq - 1 -> [B, Sq, Hq, D].

    The cache is paged with block_table [B, pages_per_seq] (k_cache/v_cache [num_pages, page_size, Hkv, D]), else one
    row per sequence ([B, max_len, Hkv, D]). cache_seqlens: the cached length before the new tokens (an int or [B];
    None: the whole cache, no new k/v). The queries are each sequence's last Sq positions (bottom-right causal).
    `num_splits` is a CUDA tuning knob, accepted and moot; rotary embedding, cache_batch_idx, cache_leftpad,
    alibi_slopes and the softmax LSE are refused (UnsupportedAttentionCall)."""
    from . import ragged_paged_attention

    name = "flash_attn_with_kvcache"
    unsupported = {"rotary_cos": rotary_cos, "rotary_sin": rotary_sin, "cache_batch_idx": cache_batch_idx,
                   "cache_leftpad": cache_leftpad}
    for arg, value in unsupported.items():
        if value is not None:
            raise _refuse(name, f"{arg}: not supported by this kernel; apply it before the call and pass None")
    if return_softmax_lse:
        raise _refuse(name, "return_softmax_lse=True: the kernel does not return the softmax log-sum-exp; pass False")
    if q.dim() != 4 or k_cache.dim() != 4:
        raise _refuse(name, f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}: expected [batch, seqlen, heads, "
                            "head_dim] and a 4-D cache")
    if (k is None) != (v is None):
        raise _refuse(name, "pass both k and v (the new tokens), or neither")
    b, sq = q.shape[0], q.shape[1]
    if k is not None and (k.dim() != 4 or tuple(k.shape[:2]) != (b, sq) or tuple(v.shape) != tuple(k.shape)):
        raise _refuse(name, f"k {tuple(k.shape)}, v {tuple(v.shape)}: expected [batch, seqlen_q, kv_heads, head_dim] "
                            f"with q's batch and seqlen ({b}, {sq})")
    device = q.device
    if block_table is None:
        table = torch.arange(b, dtype=torch.int32, device=device)[:, None]
        if k_cache.shape[0] != b:
            raise _refuse(name, f"k_cache {tuple(k_cache.shape)} without block_table: expected one cache row per "
                                f"sequence ({b})")
    else:
        table = block_table
        if table.dim() != 2 or table.shape[0] != b:
            raise _refuse(name, f"block_table of shape {tuple(table.shape)}: expected [batch={b}, pages_per_seq]")
    new = 0 if k is None else sq
    if cache_seqlens is None:
        if k is not None:
            raise _refuse(name, "new k/v without cache_seqlens: pass each sequence's cached length before them")
        lens = torch.full((b,), table.shape[1] * k_cache.shape[1], dtype=torch.int32, device=device)
    elif isinstance(cache_seqlens, torch.Tensor):
        lens = _index_tensor(cache_seqlens, "cache_seqlens", name).reshape(-1) + new
    else:
        try:
            cached = int_arg(name, "cache_seqlens", cache_seqlens, low=0)
        except ValueError as e:
            raise _refuse(name, str(e).removeprefix(f"{name}: ")) from None
        lens = torch.full((b,), cached + new, dtype=torch.int64, device=device)
    causal, window = mask_options(name, causal=bool(causal), window_size=window_size, max_seqlen_q=sq,
                                  dropout_p=0.0, alibi_slopes=alibi_slopes, return_attn_probs=False)
    cu_q = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device=device)
    queries = q.reshape(b * sq, *q.shape[2:])
    keys = None if k is None else k.reshape(b * sq, *k.shape[2:])
    values = None if v is None else v.reshape(b * sq, *v.shape[2:])
    caches = (k_cache, v_cache)
    if block_table is None:  # one page of max_len rows per sequence: the same pages, viewed
        caches = tuple(c.reshape(b, c.shape[1], *c.shape[2:]) for c in caches)
    out, _, _ = ragged_paged_attention(queries, keys, values, *caches, lens, table, cu_q, num_seqs=b,
                                       sinks=_sinks(s_aux, q.shape[2], name),
                                       sm_scale=_scale(softmax_scale, q.shape[-1]), sliding_window=window,
                                       soft_cap=_soft_cap(softcap, name), causal=causal)
    return out.reshape(q.shape)
