"""The attention kind's contract: its name (what kernel.yaml `replaces` and registry.yaml `layers` call it) and the
Protocol its kernel keeps in its torch entry (tests/verify/test_kernel_contract.py holds every kernel that `replaces`
the kind to it). Typing only: importing this imports no framework."""

from __future__ import annotations

from typing import Any, Protocol

NAME = "attention"
#: The attention module attribute holding its AttentionHook, read at call time.
HOOK_ATTR = "_kernel_hub_attention"


class AttentionKernel(Protocol):
    """Layer kind `attention`: q[B,Hq,Sq,D], k/v[B,Hkv,Skv,D] -> [B,Hq,Sq,D]; causal bottom-right, per-sequence real
    lengths (rows past a q length come out 0)."""

    def flash_attention(self, q: Any, k: Any, v: Any, *, causal: bool = False, sm_scale: float | None = None,
                        sliding_window: int | None = None, logits_soft_cap: float | None = None, sinks: Any = None,
                        q_lengths: Any = None, kv_lengths: Any = None) -> Any:
        ...
