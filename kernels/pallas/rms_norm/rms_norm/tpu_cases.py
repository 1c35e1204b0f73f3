"""TPU compile cases: what kernel-hub's compile gate lowers and compiles with the real TPU compiler (libtpu, ahead
of time, one mock TPU per generation), so a kernel Mosaic would reject never ships.

The seed models' hidden sizes (2048 Qwen3-30B-A3B, 2112 Gemma 4 26B-A4B, 2880 GPT-OSS, 4096 Mixtral) at decode (64
tokens) and prefill (4096 tokens), forward and backward (the dx / dw-partials kernel), bf16 and f32; the two forms
alternate so both are compiled. `qk_norm_rope` at the seed models' attention fronts on one of 8 devices (Qwen3:
4 query + 1 KV heads of 128; Gemma 4 sliding: 2 + 1 of 256, values normed; Gemma 4 global: 2 + 1 of 512, keys =
values, a quarter rotated), decode and prefill, forward (its backward is XLA's). Both ops with their weights
stacked over 48 layers (`layer=`, traced) at decode; rms_norm with the residual add fused (`residual=`) there too.
rms_norm's sandwich form (`x_weight=`: x normed, added, normed again) at decode, tagged "sandwich".
`attention_front` (the residual add, the input norm, the q/k/v projection and qk_norm_rope in one call) at the same
three fronts with their models' hidden sizes and every weight stacked over 48 layers, at decode (64 and 1 tokens,
bf16, and f32) and prefill, tagged "front".
Never imports kernel_hub.
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


#: name -> (query heads, KV heads, head_dim, rotary dims, values, keys are values): one device's attention front.
FRONTS = {"qwen3": (4, 1, 128, 128, "raw", False), "gemma4_sliding": (2, 1, 256, 256, "normed", False),
          "gemma4_global": (2, 1, 512, 128, "normed", True)}


#: Layers of the stacked-weight cases (Qwen3-30B-A3B's 48: a stack of three 16-row blocks).
LAYERS = 48


def stacked_builder(tokens: int, hidden: int, dtype: str, residual: bool = False, sandwich: bool = False
                    ) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): rms_norm reading row `layer` (traced) of a [LAYERS, hidden] weight stack (with the residual add
    fused: its normed output; with `sandwich`, x normed by a second stack first), or its gradient."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            import jax

            from .api import rms_norm

            sds = jax.ShapeDtypeStruct
            args = (sds((tokens, hidden), dtype), sds((LAYERS, hidden), dtype), sds((), "int32"),
                    sds((tokens, hidden), dtype))
            if sandwich:
                args += (sds((LAYERS, hidden), dtype),)
                fn = lambda x, w, i, r, wx: rms_norm(x, w, eps=1e-6, layer=i, residual=r, x_weight=wx,
                                                     implementation="pallas", interpret=False)[0]
            elif residual:
                fn = lambda x, w, i, r: rms_norm(x, w, eps=1e-6, layer=i, residual=r, implementation="pallas",
                                                 interpret=False)[0]
            else:
                fn = lambda x, w, i, r: rms_norm(x, w, eps=1e-6, layer=i, implementation="pallas", interpret=False)
            return forward_or_grad(fn, args, grad, (0, 1))

        return build

    return make


def qk_rope_builder(tokens: int, front: tuple, dtype: str, layers: int | None = None
                    ) -> Callable[[bool], Callable[[], Built]]:
    nq, nkv, d, rot, values, kav = front

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            import jax

            from .api import qk_norm_rope

            width = (nq + nkv * (1 if kav else 2)) * d
            sds = jax.ShapeDtypeStruct
            w = (d,) if layers is None else (layers, d)
            args = (sds((tokens, width), dtype), sds(w, dtype), sds(w, dtype), sds((tokens, d), "float32"),
                    sds((tokens, d), "float32"), sds((), "int32"))
            fn = lambda *a: qk_norm_rope(*a[:5], q_heads=nq, kv_heads=nkv, eps=1e-6, values=values,
                                         keys_are_values=kav, rotary_dims=rot, implementation="pallas",
                                         interpret=False, layer=None if layers is None else a[5])
            return fn, args

        return build

    return make


#: front name -> the model's hidden size (the input norm's width and the projection's rows).
FRONT_HIDDEN = {"qwen3": 2048, "gemma4_sliding": 2816, "gemma4_global": 2816}


def front_builder(tokens: int, front: str, dtype: str) -> Callable[[bool], Callable[[], Built]]:
    """attention_front at one device's front of `front` with every weight stacked over LAYERS, the residual fused."""
    nq, nkv, d, rot, values, kav = FRONTS[front]
    hidden = FRONT_HIDDEN[front]

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            import jax

            from .front import attention_front

            width = (nq + nkv * (1 if kav else 2)) * d
            sds = jax.ShapeDtypeStruct
            args = (sds((tokens, hidden), dtype), sds((LAYERS, hidden), dtype), sds((LAYERS, hidden, width), dtype),
                    sds((LAYERS, d), dtype), sds((LAYERS, d), dtype), sds((tokens, d), "float32"),
                    sds((tokens, d), "float32"), sds((tokens, hidden), dtype), sds((), "int32"))
            fn = lambda *a: attention_front(*a[:7], residual=a[7], layer=a[8], q_heads=nq, kv_heads=nkv, eps=1e-6,
                                            values=values, keys_are_values=kav, rotary_dims=rot,
                                            implementation="pallas", interpret=False)
            return fn, args

        return build

    return make


def front_cases() -> list[CompileCase]:
    out: list[CompileCase] = []
    for front in FRONTS:
        for tokens, phase in ((64, "decode"), (1, "decode"), (4096, "prefill")):
            out += fwd_bwd(f"front_{phase}_t{tokens}_{front}_layers{LAYERS}:bf16", "bfloat16",
                           (phase, "bfloat16", "front"), front_builder(tokens, front, "bfloat16"), backward=False)
    out += fwd_bwd(f"front_decode_t64_qwen3_layers{LAYERS}:f32", "float32", ("decode", "float32", "front"),
                   front_builder(64, "qwen3", "float32"), backward=False)
    return out


def compile_cases() -> list[CompileCase]:
    """Every (phase, hidden, dtype) forward and backward, and every attention front's forward; the decode 2112 bf16
    pair and the Qwen3 decode front are also tagged "smoke"."""
    out: list[CompileCase] = []
    for phase, tokens in TOKENS.items():
        for front, dims in FRONTS.items():
            out += fwd_bwd(f"qk_rope_{phase}_t{tokens}_{front}:bf16", "bfloat16", (phase, "bfloat16"),
                           qk_rope_builder(tokens, dims, "bfloat16"), backward=False)
    out += front_cases()
    out += fwd_bwd(f"qk_rope_decode_t64_qwen3_layers{LAYERS}:bf16", "bfloat16", ("decode", "bfloat16"),
                   qk_rope_builder(64, FRONTS["qwen3"], "bfloat16", LAYERS), backward=False)
    for hidden in (2048, 2816):  # Qwen3-30B-A3B's and Gemma 4 26B-A4B's hidden sizes
        out += fwd_bwd(f"decode_t64_h{hidden}_layers{LAYERS}:bf16", "bfloat16", ("decode", "bfloat16"),
                       stacked_builder(64, hidden, "bfloat16"), backward=True)
        out += fwd_bwd(f"decode_t64_h{hidden}_layers{LAYERS}_add:bf16", "bfloat16", ("decode", "bfloat16"),
                       stacked_builder(64, hidden, "bfloat16", residual=True), backward=False)
        out += fwd_bwd(f"decode_t64_h{hidden}_layers{LAYERS}_sandwich:bf16", "bfloat16",
                       ("decode", "bfloat16", "sandwich"), stacked_builder(64, hidden, "bfloat16", sandwich=True),
                       backward=False)
    for phase, tokens in TOKENS.items():
        for i, hidden in enumerate(HIDDEN):
            for dtype in DTYPES:
                zc = bool(i % 2)
                name = f"{phase}_t{tokens}_h{hidden}{'_zc' if zc else ''}:{SHORT[dtype]}"
                out += fwd_bwd(name, dtype, (phase, dtype), builder(tokens, hidden, dtype, zc), backward=True)
    smoke = {"fwd:decode_t64_h2112_zc:bf16", "bwd:decode_t64_h2112_zc:bf16", "fwd:qk_rope_decode_t64_qwen3:bf16"}
    return with_smoke(out, smoke)
