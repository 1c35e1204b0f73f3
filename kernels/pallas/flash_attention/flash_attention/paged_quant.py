"""fp8 KV caches of ragged paged attention: which chips take them, and how new rows are stored.

Storage: float8_e4m3fn with one scale per cache (k_scale, v_scale: a stored value x means x * scale), as vLLM and
quantized checkpoints carry them. Why per tensor rather than per page or head: the scale is then a static number
folded into arithmetic the kernel does anyway (k_scale into the logits' sm_scale, v_scale into the final division by
the softmax denominator), so dequantizing is a dtype cast and nothing else, the page layout and its DMAs stay those of
a bf16 cache, and a scale never has to be read, written or kept consistent beside the pages. Per-page scales would
track outliers tighter but make every in-place write a read-modify-write of its page's scale.

Chips: v6e and v7x have fp8 in hardware; v4, v5e and v5p do not, and a cache in fp8 is refused there with one
ValueError naming the chip (never silently widened to bf16). CPUs and other non-TPU devices take fp8 caches (the
"cpu", "xla" and interpreted paths dequantize in software), for development.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._vendor.chips import chip_for_device_kind

FP8_KV = "float8_e4m3fn"
#: The largest finite float8_e4m3fn; rows are clipped to it before the cast (the cast itself makes NaN past it).
E4M3_MAX = 448.0
#: Generations without fp8 hardware, and what to use there.
NO_FP8 = ("v4", "v5e", "v5p")


def is_fp8(dtype: Any) -> bool:
    return jnp.dtype(dtype).name == FP8_KV


def fp8_refusal(device_kind: str | None) -> str | None:
    """Why a float8_e4m3fn KV cache cannot run on `device_kind`, or None when it can (v6e, v7x, CPU, unknown)."""
    chip = chip_for_device_kind(device_kind)
    if chip is None or chip.name not in NO_FP8:
        return None
    return (f"ragged_paged_attention: a float8_e4m3fn KV cache needs fp8 hardware (TPU v6e or v7x); this array is on "
            f"{device_kind!r} ({chip.name}), which has none: allocate the caches in bfloat16 there")


def quantize_rows(x: jax.Array, cache_dtype: Any, scale: float) -> jax.Array:
    """Rows to store in a cache of `cache_dtype`: a plain cast for a float cache; for fp8, x / scale clipped to
    +-E4M3_MAX first, so an overflow saturates instead of becoming NaN (a NaN input stays NaN)."""
    if not is_fp8(cache_dtype):
        return x.astype(cache_dtype)
    y = x.astype(jnp.float32) / jnp.float32(scale)
    return jnp.clip(y, -E4M3_MAX, E4M3_MAX).astype(cache_dtype)
