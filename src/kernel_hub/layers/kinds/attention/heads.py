"""Head sizes the kernel takes: multi-head latent attention (DeepSeek-V2/V3, Mistral 4, ...) calls with a value head
size other than the query/key one; the kernel takes one head size, so the smaller side is zero-padded (exact: zero q/k
columns add nothing to the logits, zero v columns only add output columns that are dropped) and the softmax scale is
always passed explicitly from the call (the module's `scaling`) or the unpadded q/k head size."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HeadPad:
    """Zero columns that give q/k and v one head size (what the kernel takes); the output keeps `dv` columns."""

    qk: int  # columns added to q and k (value head larger)
    v: int  # columns added to v (value head smaller, e.g. DeepSeek-V3: q/k 192, v 128)
    dv: int
    scale: float  # the softmax scale of the unpadded call


def plan_heads(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...],
               scaling: float | None) -> tuple[HeadPad | None, str]:
    """Pure decision on q/k/v [B,H,S,D] shapes: the zero padding that makes the call one the kernel takes (value head
    size != query/key head size, as in multi-head latent attention), or (None, why not)."""
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        return None, f"q/k/v of {len(q)}/{len(k)}/{len(v)} dims"
    if tuple(k[:3]) != tuple(v[:3]):
        return None, f"key {tuple(k)} and value {tuple(v)} differ beyond the head size"
    if q[-1] != k[-1]:
        return None, f"query head size {q[-1]} differs from the key head size {k[-1]}"
    d, dv = int(k[-1]), int(v[-1])
    scale = float(scaling) if scaling is not None else d ** -0.5
    return HeadPad(qk=max(0, dv - d), v=max(0, d - dv), dv=dv, scale=scale), ""



def pad_heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              pad: HeadPad) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q/k/v [B,H,S,D] with the zero columns `pad` adds (the output is cut back to `pad.dv` columns by the caller)."""
    if pad.qk:
        query, key = torch.nn.functional.pad(query, (0, pad.qk)), torch.nn.functional.pad(key, (0, pad.qk))
    if pad.v:
        value = torch.nn.functional.pad(value, (0, pad.v))
    return query, key, value
