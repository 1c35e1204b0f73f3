"""TPU compile cases: the wrapper as a TPU user calls it (default implementation order: Tokamax's Mosaic
attention, then Tokamax's XLA attention where Mosaic refuses a feature), lowered and compiled by kernel-hub's
compile gate with the real TPU compiler (libtpu, ahead of time, one mock TPU per generation).

`compile_cases()` lists cases; each `build()` returns (function, abstract arguments as ShapeDtypeStructs):
the validation scenarios (prefill forward and backward, decode) in bf16 and f32, and four models' head
geometries (attention_shapes.py, vendored) at prefill and decode. Tokamax 0.0.12's Mosaic kernel refuses
sliding windows (mask.k_start), the batched boolean mask of decode and per-sequence lengths (mask.q_end) with
NotImplementedError while tracing; the wrapper's dispatch then runs "xla", as it would on a TPU, and the gate
records per case which implementation compiled (the kernel contract's last_implementation()). Tokamax has no
attention sinks, so GPT-OSS runs without them. Never imports kernel_hub.
"""

from __future__ import annotations

from collections.abc import Callable

from ._vendor.attention_compile import attention_compile_cases
from ._vendor.compile_case import Built, CompileCase, forward_or_grad
from .validation import _LARGE, Scenario


def builder(sc: Scenario, dtype: str) -> Callable[[bool], Callable[[], Built]]:
    """make(grad): the forward, or d/dq, dk, dv through the chosen implementation's backward."""

    def make(grad: bool) -> Callable[[], Built]:
        def build() -> Built:
            import jax
            import jax.numpy as jnp

            from .api import decode_attention, flash_attention

            sds = jax.ShapeDtypeStruct
            kv = sds((sc.b, sc.hkv, sc.skv, sc.d), dtype)
            kw = dict(sliding_window=sc.window, logits_soft_cap=sc.soft_cap)  # default order, as a user calls it
            if sc.decode:
                args = (sds((sc.b, sc.hq, sc.d), dtype), kv, kv, sds((sc.b,), jnp.int32))
                return (lambda q, k, v, lens: decode_attention(q, k, v, lens, **kw)), args
            args = (sds((sc.b, sc.hq, sc.sq, sc.d), dtype), kv, kv)
            if sc.ragged:
                lens = sds((sc.b,), jnp.int32)
                fn = lambda q, k, v, ql, kl: flash_attention(q, k, v, causal=sc.causal, q_lengths=ql,
                                                             kv_lengths=kl, **kw)
                args = (*args, lens, lens)
            else:
                fn = lambda q, k, v: flash_attention(q, k, v, causal=sc.causal, **kw)
            return forward_or_grad(fn, args, grad, (0, 1, 2))

        return build

    return make


def compile_cases() -> list[CompileCase]:
    """Every TPU compile case (attention_compile.py), the models without sinks; a small prefill (forward +
    backward, Mosaic) and a decode (XLA: Mosaic refuses its mask) are also tagged "smoke"."""
    return attention_compile_cases(builder, _LARGE, sinks=False)
