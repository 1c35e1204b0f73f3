"""MoE expert geometries of real models: the shapes the TPU compile cases and kernel-hub's TPU cost model use.

Vendored into the ragged-dot kernels (kernel.yaml `vendor:`). Never imports kernel_hub.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .compile_case import SHORT, Built, CompileCase, fwd_bwd


@dataclasses.dataclass(frozen=True)
class MoeGeometry:
    """One model's routed experts: x[T, hidden] -> top_k of `experts` SiLU/GELU-gated MLPs."""

    model: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int

    def projections(self, tokens: int) -> tuple[tuple[str, int, int, int, int], ...]:
        """(name, M, K, N, G) of the two ragged dots of one MoE layer over `tokens` tokens."""
        m = tokens * self.top_k
        return (
            ("gate_up", m, self.hidden, 2 * self.intermediate, self.experts),
            ("down", m, self.intermediate, self.hidden, self.experts),
        )


#: From the models' config.json. Gemma 4 26B-A4B's hidden size is 2112 (not the 2816 some notes give).
MOE_MODELS = (
    MoeGeometry("qwen3_30b_a3b", hidden=2048, intermediate=768, experts=128, top_k=8),
    MoeGeometry("gemma4_26b_a4b", hidden=2112, intermediate=704, experts=128, top_k=8),
    MoeGeometry("gpt_oss_20b", hidden=2880, intermediate=2880, experts=32, top_k=4),
    MoeGeometry("mixtral_8x7b", hidden=4096, intermediate=14336, experts=8, top_k=2),
)
#: Tokens per call: a decode batch and a prefill chunk.
PHASES = {"decode": 64, "prefill": 4096}


def model_compile_cases(builder: Callable[[int, int, int, int, str], Callable[[bool], Callable[[], Built]]]
                        ) -> list[CompileCase]:
    """TPU compile cases of a ragged dot at every model's expert projections and phase: the forward in bf16 and
    f32, the training-sized (prefill) backward in bf16; builder(m, k, n, g, dtype) -> make(grad)."""
    out: list[CompileCase] = []
    for geo in MOE_MODELS:
        for phase, tokens in PHASES.items():
            for proj, m, k, n, g in geo.projections(tokens):
                for dtype, short in SHORT.items():
                    tags = ("model", geo.model, phase, proj, dtype)
                    out += fwd_bwd(f"{geo.model}:{phase}:{proj}:{short}", dtype, tags, builder(m, k, n, g, dtype),
                                   phase == "prefill" and short == "bf16")
    return out
