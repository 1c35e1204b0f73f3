"""The quantized weight formats of the torch entry, as data and pure functions: the dtypes, each one's scale layout,
the check of a call's operands, and quantize / dequantize (rhs orientation [G, K, N], lhs [M, K]).

- int8 rhs, per (expert, output channel) scales: rhs_scale [G, 1, N]; weight = rhs[g, k, n] * rhs_scale[g, 0, n].
- float8_e4m3fn rhs, 128 x 128 block scales: rhs_scale [G, ceil(K/128), ceil(N/128)];
  weight = rhs[g, k, n] * rhs_scale[g, k // 128, n // 128] (transformers' fine-grained FP8 layout, whose
  `weight_scale_inv` of an nn.Linear weight [out, in] is [ceil(out/128), ceil(in/128)]: the same rule transposed).
Shared by the grouped product (quantized_ragged_dot.py) and the native kernel's self-tests (native_quant.py).
Imports torch only; never imports kernel_hub.
"""

from __future__ import annotations

import torch

#: Weight dtypes with scales, and the scale layout each takes.
QUANTIZED_DTYPES = (torch.int8, torch.float8_e4m3fn)
#: Accepted lhs dtypes for quantized weights.
LHS_DTYPES = (torch.bfloat16, torch.float32)
#: The fine-grained FP8 block (transformers' weight_block_size [128, 128]).
BLOCK = 128
#: Largest int8 magnitude used (symmetric: -127..127, so a scale maps both signs alike).
INT8_MAX = 127
#: Largest finite float8_e4m3fn value.
FP8_MAX = 448.0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def expected_scale_shape(rhs_dtype: torch.dtype, g: int, k: int, n: int) -> tuple[int, int, int]:
    """The rhs_scale shape a [G, K, N] rhs of `rhs_dtype` needs."""
    if rhs_dtype == torch.int8:
        return (g, 1, n)
    return (g, _cdiv(k, BLOCK), _cdiv(n, BLOCK))


def check_quantized(lhs: torch.Tensor, rhs: torch.Tensor, rhs_scale: torch.Tensor | None) -> None:
    """One ValueError naming the argument to fix when lhs / rhs / rhs_scale do not form a quantized ragged dot."""
    if rhs.dtype not in QUANTIZED_DTYPES:
        raise ValueError(f"rhs_scale is given, so rhs must be int8 (per-channel scales) or float8_e4m3fn (128x128 "
                         f"block scales); got rhs {rhs.dtype}")
    if rhs_scale is None:
        raise ValueError(f"rhs is {rhs.dtype}: pass its float32 rhs_scale "
                         f"{list(expected_scale_shape(rhs.dtype, *rhs.shape))} (quantized weights need their scales)")
    if not isinstance(rhs_scale, torch.Tensor):
        raise ValueError(f"rhs_scale must be a torch.Tensor, got {type(rhs_scale).__name__}")
    if rhs_scale.dtype != torch.float32:
        raise ValueError(f"rhs_scale must be float32, got {rhs_scale.dtype}")
    want = expected_scale_shape(rhs.dtype, *rhs.shape)
    if tuple(rhs_scale.shape) != want:
        layout = ("[G, 1, N] (one scale per expert and output channel)" if rhs.dtype == torch.int8 else
                  "[G, ceil(K/128), ceil(N/128)] (one scale per 128x128 block)")
        raise ValueError(f"rhs_scale must have shape {list(want)} for {rhs.dtype} rhs {list(rhs.shape)}: {layout}; "
                         f"got {list(rhs_scale.shape)}")
    if rhs_scale.device != rhs.device:
        raise ValueError(f"rhs_scale is on {rhs_scale.device}, rhs on {rhs.device}: put them on one device")
    if lhs.dtype not in LHS_DTYPES:
        raise ValueError(f"lhs must be bfloat16 or float32 with quantized rhs, got {lhs.dtype}")
    if rhs_scale.requires_grad and torch.is_grad_enabled():
        raise ValueError("rhs_scale requires grad: quantized weights are frozen (gradients flow to lhs only); "
                         "pass rhs_scale.detach()")


def dequantize(rhs: torch.Tensor, rhs_scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weights rhs stands for, rhs[g, k, n] * scale, as a new [G, K, N] tensor of `dtype` (float32 math)."""
    w = rhs.to(torch.float32)
    if rhs.dtype == torch.int8:
        return (w * rhs_scale).to(dtype)
    k, n = rhs.shape[-2], rhs.shape[-1]
    full = rhs_scale.repeat_interleave(BLOCK, dim=-2)[..., :k, :].repeat_interleave(BLOCK, dim=-1)[..., :n]
    return (w * full).to(dtype)


def quantize(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(rhs, rhs_scale) for a float [G, K, N] `weight`: symmetric int8 per output channel (scale = max|w| / 127 over
    K) or float8_e4m3fn per 128x128 block (scale = max|w| / 448 over the block). An all-zero channel or block gets
    scale 1 (its values are 0). Round to nearest; nothing saturates (max|w| maps to exactly 127 / 448)."""
    if weight.dim() != 3 or not weight.is_floating_point():
        raise ValueError(f"weight must be a float [G, K, N] tensor, got {weight.dtype} {list(weight.shape)}")
    w = weight.detach().to(torch.float32)
    g, k, n = w.shape
    if dtype == torch.int8:
        amax = w.abs().amax(dim=1, keepdim=True)  # [G, 1, N]
        scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
        q = torch.round(w / scale).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        return q, scale
    if dtype != torch.float8_e4m3fn:
        raise ValueError(f"dtype must be torch.int8 or torch.float8_e4m3fn, got {dtype}")
    kb, nb = _cdiv(k, BLOCK), _cdiv(n, BLOCK)
    padded = torch.nn.functional.pad(w, (0, nb * BLOCK - n, 0, kb * BLOCK - k))
    amax = padded.abs().reshape(g, kb, BLOCK, nb, BLOCK).amax(dim=(2, 4))  # [G, KB, NB]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    full = scale.repeat_interleave(BLOCK, dim=1)[:, :k].repeat_interleave(BLOCK, dim=2)[:, :, :n]
    q = (w / full).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale
