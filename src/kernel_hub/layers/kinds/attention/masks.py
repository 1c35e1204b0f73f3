"""Reading the mask an attention layer receives: as a bool keep-mask, as per-sequence contiguous runs of real keys and
real queries, and checked against the causal / sliding-window mask those runs mean; and the additive mask eager
attention needs where the previous implementation's mask function handed a bool mask or none.

For a hooked layer the mask is read as: keys in one contiguous run per sequence, queries whose own token is a real key
(or, under a static cache, that attend any key) in one contiguous run, causal (bottom-right) and sliding window
relative to those runs. Pure tensor functions: no model state.
"""

from __future__ import annotations

from typing import Any

import torch


def materialized_mask(query: torch.Tensor, key: torch.Tensor, *, causal: bool,
                      window: int | None) -> torch.Tensor | None:
    """The additive [1, 1, Sq, Skv] mask a call without one means (causal bottom-right, sliding window), for the eager
    attention: the previous implementation's mask function may hand None to a layer that masks by `is_causal`
    (sdpa), and eager attention would then attend every key. None where nothing is masked."""
    if not causal and window is None:
        return None
    sq, skv = query.shape[2], key.shape[2]
    i = torch.arange(sq, device=query.device)[:, None] + (skv - sq)
    j = torch.arange(skv, device=query.device)[None, :]
    keep = j <= i if causal else torch.ones(sq, skv, dtype=torch.bool, device=query.device)
    if window is not None:
        keep &= j > i - window
    bias = torch.zeros(sq, skv, dtype=query.dtype, device=query.device)
    return bias.masked_fill(~keep, torch.finfo(query.dtype).min)[None, None]


def eager_mask(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, attention_mask: Any,
               kwargs: dict[str, Any]) -> Any:
    """The mask as eager attention reads it: additive, in the query's dtype. Under "kernel_hub" the model builds the
    previous implementation's mask (kernel_hub_mask): sdpa's is a bool keep-mask, or None where sdpa would mask by
    `is_causal`; eager attention adds its mask to the scores, so a bool mask would add 1 to kept scores and mask
    nothing (wrong numbers, silently). None is materialized from the layer's causal / sliding-window facts."""
    if attention_mask is None:
        causal = kwargs.get("is_causal")
        window = kwargs.get("sliding_window")
        causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
        return materialized_mask(query, key, causal=causal, window=None if window is None else int(window))
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.bool:
        bias = torch.zeros(attention_mask.shape, dtype=query.dtype, device=attention_mask.device)
        return bias.masked_fill(~attention_mask, torch.finfo(query.dtype).min)
    return attention_mask


def as_bool_mask(mask: torch.Tensor) -> tuple[torch.Tensor | None, str]:
    """A 4-D bool or additive (0 / very negative) mask as bool [B, Sq, Skv]; else why not."""
    if mask.dim() != 4:
        return None, f"{mask.dim()}-D attention mask"
    if mask.shape[1] != 1:
        return None, "per-head attention mask"
    m = mask[:, 0]
    if m.dtype == torch.bool:
        return m, ""
    if not m.dtype.is_floating_point:
        return None, f"{m.dtype} attention mask"
    keep = m == 0
    if not bool((keep | (m <= torch.finfo(m.dtype).min / 2)).all()):
        return None, "additive mask with bias values"
    return keep, ""


def contiguous_run(flags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of flags [B, N]: (start, length) of its True run, and whether every row has one run (a bool tensor)."""
    n = flags.shape[1]
    idx = torch.arange(n, device=flags.device)
    count = flags.sum(1)
    start = torch.where(flags, idx, n).amin(1).clamp(max=n)
    end = torch.where(flags, idx + 1, 0).amax(1)
    ok = ((end - start).clamp(min=0) == count).all()
    start = torch.where(count > 0, start, torch.zeros_like(start))
    return start, count, ok


def query_rows(m: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two readings of which query rows [B, Sq] are real, tried in order (each is checked against the mask): those
    attending any key, which a static cache needs (its keys past the filled length are masked, so a decode query's
    own key is not the last slot); and those whose own key (new tokens come last) is a real key, which leaves
    right-padding queries out, whose rows attend every real key."""
    sq, skv = m.shape[-2:]
    own = torch.arange(sq, device=m.device) + (skv - sq)
    last = keys[:, own] if skv >= sq else torch.zeros(m.shape[0], sq, dtype=torch.bool, device=m.device)
    return m.any(2), last


def candidate_matches(m, rows, qs, ks, ql, kl, *, causal: bool, window: int | None) -> torch.Tensor:
    """Whether the causal/sliding mask over the runs (qs, ql) / (ks, kl) equals `m` on every real query row."""
    sq, skv = m.shape[-2:]
    i = torch.arange(sq, device=m.device)[None, :, None] - qs[:, None, None]
    j = torch.arange(skv, device=m.device)[None, None, :] - ks[:, None, None]
    qlen, klen = ql[:, None, None], kl[:, None, None]
    cand = (i >= 0) & (i < qlen) & (j >= 0) & (j < klen)
    pos = i + (klen - qlen)
    if causal:
        cand &= j <= pos
    if window is not None:
        cand &= j > pos - window
    return ((cand == m) | ~rows[:, :, None]).all()


