"""Packed sequences under a mask: a batch row holding several sequences one after another, each attending only its
own tokens (transformers builds this block-diagonal mask from `position_ids` that restart at 0, the padding-free
layout of DataCollatorWithFlattening, under any implementation that is not flash-named).

Such a call runs the kernel one sequence per kernel batch row, each starting at key 0, exactly as a padded batch of
the same sequences runs (call_plan.py shifts each padded row's tokens to the front). So a sequence gets the same
numbers, bit for bit, whether it came padded or packed: the kernel sees the same keys at the same offsets.

Pure tensor functions: the decision reads only the mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: One kernel row per sequence pads each to the longest: past this many slots per token of the call, the packed
#: call runs the previous implementation instead (a long sequence beside thousands of one-token ones).
MAX_PADDING = 4


@dataclass(frozen=True)
class Segments:
    """Sequences found in a mask [B, S, S]: sequence n is batch row `batch[n]`, tokens start[n]:start[n]+length[n]
    (queries and keys alike)."""

    batch: torch.Tensor  # [N] int64
    start: torch.Tensor  # [N] int64
    length: torch.Tensor  # [N] int64

    @property
    def width(self) -> int:
        return int(self.length.max()) if self.length.numel() else 0

    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([N, width] token index clamped into the row, [N, width] whether that slot holds a token of sequence n)."""
        pos = torch.arange(self.width, device=self.start.device)[None, :]
        valid = pos < self.length[:, None]
        return (self.start[:, None] + pos).clamp(max=int((self.start + self.length).max()) - 1), valid


def find_segments(m: torch.Tensor, *, causal: bool, window: int | None) -> tuple[Segments | None, torch.Tensor, str]:
    """Pure decision: the sequences packed in bool mask m [B, S, S], the real query rows [B, S], and "" when the mask
    is exactly the causal / sliding-window mask of those sequences on every real row (else None and why; None and ""
    when no row holds two sequences, so the mask is not a packed one).

    A real row attends some key and always its own; a sequence starts where a real row does not attend the row before
    it. Rows attending nothing are padding (their output is 0)."""
    _, sq, skv = m.shape
    if sq != skv:  # a cache beside the queries: read as padded rows only
        return None, m.any(2), ""
    real = m.any(2)
    idx = torch.arange(sq, device=m.device)
    own = m[:, idx, idx]
    if not bool((own | ~real).all()):
        return None, real, "a query row that does not attend its own token"
    prev = torch.zeros_like(real)
    prev[:, 1:] = m[:, idx[1:], idx[:-1]] & real[:, :-1]
    begins = real & ~prev
    if not bool((begins.sum(1) > 1).any()):
        return None, real, ""  # no row holds two sequences: not packed (the padded reading's reason stands)
    rows, cols = begins.nonzero(as_tuple=True)
    # each real token's sequence, numbered over the whole batch (a padding row in between starts a new one, so every
    # sequence is one contiguous run)
    flat = torch.cumsum(begins.reshape(-1).long(), 0).reshape(begins.shape) - 1
    counts = torch.bincount(flat[real], minlength=rows.shape[0])
    segments = Segments(batch=rows, start=cols, length=counts)
    if rows.shape[0] * segments.width > MAX_PADDING * max(m.shape[0] * sq, 1):
        return None, real, (f"{rows.shape[0]} packed sequences up to {segments.width} long would run as "
                            f"{rows.shape[0] * segments.width} padded slots for {m.shape[0] * sq} tokens")
    same = (flat[:, :, None] == flat[:, None, :]) & real[:, :, None] & real[:, None, :]
    cand = same & (idx[None, None, :] <= idx[None, :, None] if causal else same)
    if window is not None:
        cand &= idx[None, None, :] > idx[None, :, None] - window
    if not bool(((cand == m) | ~real[:, :, None]).all()):
        return None, real, "mask is not causal/sliding-window over packed sequences"
    return segments, real, ""


def gather(x: torch.Tensor, segments: Segments) -> torch.Tensor:
    """x [B, H, S, D] -> [N, H, width, D]: sequence n's tokens from position 0 (the slots past its length hold
    other tokens of the row, which the kernel masks by length)."""
    pos, _ = segments.positions()
    # contiguous, as the padded path hands the kernel: a strided operand can take another matmul path (other bits)
    return x.permute(0, 2, 1, 3)[segments.batch[:, None], pos].permute(0, 2, 1, 3).contiguous()


def scatter(out: torch.Tensor, segments: Segments, shape: tuple[int, int, int, int]) -> torch.Tensor:
    """The kernel's [N, H, width, Dv] back to [B, H, S, Dv]; rows no sequence owns are 0."""
    pos, valid = segments.positions()
    full = out.new_zeros(shape[0], shape[2], shape[1], shape[3])
    rows = segments.batch[:, None].expand_as(pos)
    full[rows[valid], pos[valid]] = out.permute(0, 2, 1, 3)[valid]
    return full.permute(0, 2, 1, 3)
