"""TPU compile cases: what kernel-hub's compile gate lowers and compiles with the real TPU compiler (libtpu, ahead
of time, one mock TPU per generation), so a kernel Mosaic would reject never ships.

The seed models' hidden sizes (2048 Qwen3-30B-A3B, 2112 Gemma 4 26B-A4B, 2880 GPT-OSS, 4096 Mixtral) at decode (64
tokens) and prefill (4096 tokens), forward and backward (the dx / dw-partials kernel), bf16 and f32; the two forms
alternate so both are compiled. Never imports kernel_hub.
"""

from __future__ import annotations

from collections.abc import Callable

from ._vendor.compile_case import Built, CompileCase, forward_or_grad, fwd_bwd, with_smoke

HIDDEN = (2048, 2112, 2880, 4096)
TOKENS = {"decode": 64, "prefill": 4096}
DTYPES = ("bfloat16", "float32")
SHORT = {"bfloat16": "bf16", "float32": "f32"}


def builder(tokens: int, hidden: int, dtype: str, zero_centered: bool) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): the forward, or d/dx, dweight (the backward kernel after the forward)."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            import jax

            from .api import rms_norm

            args = (jax.ShapeDtypeStruct((tokens, hidden), dtype), jax.ShapeDtypeStruct((hidden,), dtype))
            fn = lambda x, w: rms_norm(x, w, eps=1e-6, zero_centered=zero_centered, implementation="pallas",
                                       interpret=False)
            return forward_or_grad(fn, args, grad, (0, 1))

        return build

    return make


def compile_cases() -> list[CompileCase]:
    """Every (phase, hidden, dtype) forward and backward; the decode 2112 bf16 pair is also tagged "smoke"."""
    out: list[CompileCase] = []
    for phase, tokens in TOKENS.items():
        for i, hidden in enumerate(HIDDEN):
            for dtype in DTYPES:
                zc = bool(i % 2)
                name = f"{phase}_t{tokens}_h{hidden}{'_zc' if zc else ''}:{SHORT[dtype]}"
                out += fwd_bwd(name, dtype, (phase, dtype), builder(tokens, hidden, dtype, zc), backward=True)
    smoke = {"fwd:decode_t64_h2112_zc:bf16", "bwd:decode_t64_h2112_zc:bf16"}
    return with_smoke(out, smoke)
