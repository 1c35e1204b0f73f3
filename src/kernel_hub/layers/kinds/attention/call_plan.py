"""Planning one attention call: the pure decision whether the kernel can compute exactly what this call asks (its
kwargs, its mask) and with which arguments. The mask's runs become a per-sequence shift plus q/kv lengths; the
candidate mask is checked against the received one on every real query row, so the kernel only runs where it computes
exactly what the mask says. Padding query rows (whose own token is padding) come out 0. A mask holding several
sequences packed in one row (padding-free batches) runs one kernel row per sequence (segments.py).

Sparse selections: under any implementation but "eager"/"sdpa", DeepSeek sparse attention models (mistral_large4,
glm_moe_dsa, deepseek_v32, hy_v4, dots3_note, axk2 in transformers 5.24) stop folding their indexer's top-k keys
into the mask and pass them as `indices` (`block_indices` for a block indexer) for a sparse kernel to consume.
Neither the kernel nor the previous implementation called under "kernel_hub" honours them, so such a call is never
run here: validation records it and kernelize leaves the whole model on its previous implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .masks import as_bool_mask, candidate_matches, contiguous_run, query_rows
from .segments import Segments, find_segments

#: kwargs the kernel cannot honour: a call carrying any of them (not None) runs the previous implementation.
UNSUPPORTED_KWARGS = ("position_bias", "cu_seq_lens_q", "cu_seq_lens_k", "head_mask")
#: kwargs carrying a sparse key selection a model masks only under "eager"/"sdpa" -> what they are.
SPARSE_KWARGS = {"indices": "DeepSeek sparse attention top-k key indices",
                 "block_indices": "block-sparse attention key-block indices"}


@dataclass(frozen=True)
class AttentionCallPlan:
    """Kernel arguments for one call: shifts move each sequence's real tokens to the front."""

    causal: bool
    window: int | None
    q_shift: torch.Tensor | None = None  # [B] first real query row
    kv_shift: torch.Tensor | None = None  # [B] first attended key
    q_lengths: torch.Tensor | None = None
    kv_lengths: torch.Tensor | None = None
    rows: torch.Tensor | None = None  # [B, Sq] real query rows (None: all)
    segments: Segments | None = None  # sequences packed in the rows: one kernel batch row each


def sparse_selection(kwargs: dict[str, Any]) -> str:
    """Pure decision: why this call cannot run under "kernel_hub" at all ("" if it can). A sparse selection passed
    as a kwarg is only there because the implementation is not eager/sdpa (else it is in the mask)."""
    found = [f"{what} (`{name}`)" for name, what in SPARSE_KWARGS.items() if kwargs.get(name) is not None]
    if not found:
        return ""
    return (f"{', '.join(found)}: the model masks them only under eager/sdpa and hands them to any other attention "
            "implementation, and the kernel computes dense attention")


def plan_kwargs(kwargs: dict[str, Any], *, training: bool) -> str:
    """Pure decision: why the kernel cannot honour this call's kwargs ("" if it can)."""
    why = sparse_selection(kwargs)
    if why:
        return why
    if kwargs.get("dropout", 0.0) and training:
        return "attention dropout"
    if kwargs.get("output_attentions"):
        return "output_attentions"
    return next((name for name in UNSUPPORTED_KWARGS if kwargs.get(name) is not None), "")


def plan_call(
    mask: torch.Tensor | None, sq: int, skv: int, *, causal: bool, window: int | None
) -> tuple[AttentionCallPlan | None, str]:
    """Pure decision for one call: (kernel arguments, "") or (None, why the previous implementation runs)."""
    if mask is None:
        if causal and 1 < sq < skv:
            return None, "no mask with fewer queries than keys (sdpa would slice the keys)"
        return AttentionCallPlan(causal=causal, window=window), ""
    if not isinstance(mask, torch.Tensor):
        return None, f"{type(mask).__name__} attention mask"
    m, why = as_bool_mask(mask)
    if m is None:
        return None, why
    if m.shape[-2:] != (sq, skv):
        return None, f"mask {tuple(m.shape[-2:])} does not match attention ({sq}, {skv})"
    keys = m.any(1)  # [B, Skv] keys anyone attends
    ks, kl, ok_k = contiguous_run(keys)
    why = ""
    for rows in query_rows(m, keys):
        qs, ql, ok_q = contiguous_run(rows)
        if not bool(ok_k & ok_q):
            why = why or "padding is not one contiguous run per sequence"
        elif not bool(candidate_matches(m, rows, qs, ks, ql, kl, causal=causal, window=window)):
            why = why or "mask is not causal/sliding-window over padded sequences"
        else:
            break
    else:
        segments, real, packed_why = find_segments(m, causal=causal, window=window)
        if segments is None:
            return None, packed_why or why
        return AttentionCallPlan(causal=causal, window=window, q_lengths=segments.length.to(torch.int32),
                                 kv_lengths=segments.length.to(torch.int32), rows=real, segments=segments), ""
    full = bool((qs == 0).all() and (ks == 0).all() and (ql == sq).all() and (kl == skv).all())
    if full:
        return AttentionCallPlan(causal=causal, window=window), ""
    shifted = bool((qs != 0).any() or (ks != 0).any())
    return AttentionCallPlan(causal=causal, window=window, q_shift=qs if shifted else None,
                             kv_shift=ks if shifted else None, q_lengths=ql.to(torch.int32),
                             kv_lengths=kl.to(torch.int32), rows=rows), ""


def traced_plan(
    mask: torch.Tensor | None, sq: int, skv: int, *, causal: bool, window: int | None
) -> tuple[AttentionCallPlan | None, torch.Tensor | None, str]:
    """plan_call for torch.compile: every decision on shapes and static facts is taken here, every decision on the
    mask's values is one bool tensor `ok` (None: the plan needs no check) that picks the branch in the graph.
    The plan is always the general one (shifts and lengths): with zero shifts and full lengths it computes exactly
    what the unshifted plan does. (None, None, why): the previous implementation runs, decided statically."""
    if mask is None or not isinstance(mask, torch.Tensor):
        plan, why = plan_call(mask, sq, skv, causal=causal, window=window)
        return plan, None, why
    if mask.dim() != 4 or mask.shape[1] != 1:
        return None, None, "4-D attention mask with one head" if mask.dim() != 4 else "per-head attention mask"
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        return None, None, f"{mask.dtype} attention mask"
    if tuple(mask.shape[-2:]) != (sq, skv):
        return None, None, f"mask {tuple(mask.shape[-2:])} does not match attention ({sq}, {skv})"
    m = mask[:, 0]
    ok = torch.ones((), dtype=torch.bool, device=m.device)
    if m.dtype != torch.bool:
        keep = m == 0
        ok = (keep | (m <= torch.finfo(m.dtype).min / 2)).all()  # no bias values
        m = keep
    keys = m.any(1)
    ks, kl, ok_k = contiguous_run(keys)
    runs = []
    for rows in query_rows(m, keys):  # both readings, the first that fits chosen in the graph (torch.where)
        qs, ql, ok_q = contiguous_run(rows)
        runs.append((rows, qs, ql, ok_q & candidate_matches(m, rows, qs, ks, ql, kl, causal=causal, window=window)))
    (rows1, qs1, ql1, ok1), (rows2, qs2, ql2, ok2) = runs
    rows, qs, ql = torch.where(ok1, rows1, rows2), torch.where(ok1, qs1, qs2), torch.where(ok1, ql1, ql2)
    ok = ok & ok_k & (ok1 | ok2)
    return AttentionCallPlan(causal=causal, window=window, q_shift=qs, kv_shift=ks, q_lengths=ql.to(torch.int32),
                             kv_lengths=kl.to(torch.int32), rows=rows), ok, ""


