"""The torch ragged dot with quantized weights: `rhs` int8 or float8_e4m3fn plus float32 `rhs_scale`.

Formats (shared with the JAX entry; rhs is [G, K, N], lhs [M, K]): quant_format.py (int8 with per-channel scales,
float8_e4m3fn with 128 x 128 block scales; the operand check, quantize and dequantize live there too).
lhs bfloat16 or float32; the result has lhs's dtype. Products are summed in float32 against the exact dequantized
weight (integers and e4m3 values are exact in float32), then rounded once to lhs's dtype.

Where it runs: on CPU, groups of at most native_quant.MAX_ROWS rows against weights stored nn.Linear-style (rhs a
transposed view of a contiguous [G, N, K] stack, what kernelize's quantized copies are) go to the native kernel
(AVX512 or AVX2), which reads the quantized bytes and dequantizes in registers; other groups (and other devices, or
no native kernel) dequantize one expert at a time to float32 and multiply. Scales holding NaN or Inf give NaN or Inf
in exactly the outputs they scale; nothing is clamped or checked on the data (no host sync, so torch.compile traces it).

Autograd: gradients flow to lhs only (quantized weights are frozen: a scale that requires grad is refused). Under
torch.compile the grouped product is the custom op `<namespace>::cpu_grouped_quant` with a fake implementation, so
dynamo never traces the group loop. Imports torch only; never imports kernel_hub.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .._vendor.shapes import check_ragged_dot_shapes
from . import native_quant
from .grouped import (
    combine_experts,
    compiling,
    custom_op,
    nonempty_groups,
    num_workers,
    on_worker,
    ragged_dot_torch,
    route,
    run_groups,
    runs_inline,
    sizes_list,
    spread,
)
from .quant_format import QUANTIZED_DTYPES, check_quantized, dequantize

# --- the grouped product -----------------------------------------------------------------------------------------


def _native_ready(lhs: torch.Tensor, rhs: torch.Tensor) -> bool:
    """Whether this call's weights can take the native kernel: CPU, nn.Linear-style bytes, the kernel available."""
    return (lhs.device.type == "cpu" and rhs.transpose(1, 2).is_contiguous()
            and native_quant.available(rhs.dtype)[0])


def _expert_scales(rhs: torch.Tensor, rhs_scale: torch.Tensor) -> torch.Tensor:
    """The scale stack as the native kernel reads it: contiguous, rhs orientation (a copy only if it is a view)."""
    return rhs_scale.contiguous()


def grouped_matmul_quantized(lhs: torch.Tensor, rhs: torch.Tensor, rhs_scale: torch.Tensor,
                             sizes: list[int], rows: torch.Tensor | None = None) -> torch.Tensor:
    """out[rows of g] = lhs[rows of g] @ dequant(rhs[g]) in float32, rounded to lhs's dtype; rows past sum(sizes)
    zero. `rows`: take lhs[rows] as the lhs (a routed block's gather), gathered by the int16-lhs route's own pass
    where it runs. No autograd."""
    m, k = lhs.shape[0] if rows is None else rows.shape[0], lhs.shape[1]
    n = rhs.shape[2]
    items = nonempty_groups(sizes, m)
    cpu = lhs.device.type == "cpu"
    # Whole-tensor steps on one pool worker on CPU (torch_cpu.on_worker: in the caller they fork OpenMP threads)
    step = on_worker if cpu else (lambda fn: fn())
    covered = items[-1][2] if items else 0  # groups are contiguous: rows [0, covered) are all written below

    def empty(dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty((m, n), dtype=dtype, device=lhs.device)
        out[covered:].zero_()
        return out

    native = bool(items) and _native_ready(lhs, rhs)
    x16 = None
    if native and lhs.dtype == torch.bfloat16 and rhs.dtype == torch.int8 and native_quant.x16_available()[0]:
        x16 = native_quant.x16_rows(lhs, rows)  # the int16-lhs route (one native pass); None: NaN/Inf in lhs
    # Every product on the int16-lhs route: it writes lhs's dtype itself (no float32 copy to round afterwards)
    direct = x16 is not None and all(e - s <= native_quant.MAX_ROWS for _, s, e in items)
    out_dtype = lhs.dtype if direct else torch.float32
    out = empty(out_dtype) if covered == m else step(lambda: empty(out_dtype))  # nothing to zero: no worker
    x = None if direct else step(lambda: (lhs if rows is None else lhs[rows]).to(torch.float32).contiguous())
    rest = _native_groups(x16 if x16 is not None else x, rhs, _expert_scales(rhs, rhs_scale), items, out) \
        if native else items

    def one(g: int, s: int, e: int) -> None:
        assert x is not None
        torch.mm(x[s:e], dequantize(rhs[g], rhs_scale[g]), out=out[s:e])

    run_groups(rest, one, sum(e - s for _, s, e in rest) * k * n)
    return out if direct else step(lambda: out.to(lhs.dtype))


def _native_groups(x: Any, rhs: torch.Tensor, scales: torch.Tensor, items: list[tuple[int, int, int]],
                   out: torch.Tensor) -> list[tuple[int, int, int]]:
    """Run the items of at most MAX_ROWS rows on the native kernel (one call per worker, sharing a counter); returns
    the items left for the dequantize-and-multiply loop."""
    small = sorted((it for it in items if it[2] - it[1] <= native_quant.MAX_ROWS),
                   key=lambda it: it[2] - it[1], reverse=True)
    if not small:
        return items
    w = rhs.transpose(1, 2)  # [G, N, K], contiguous
    table = torch.tensor([(g, s, e - s) for g, s, e in small], dtype=torch.int64).reshape(-1, 3)
    counter = torch.zeros(1, dtype=torch.int32)

    run = native_quant.grouped_x16 if isinstance(x, tuple) else native_quant.grouped  # (int16 rows, scales): VNNI

    def drain() -> None:
        run(x, w, scales, out, table, counter)

    workers = min(num_workers(), len(small))
    if runs_inline(workers, sum(e - s for _, s, e in small) * w.shape[2] * w.shape[1]):
        drain()
    else:
        spread([drain] * workers)
    return [it for it in items if it[2] - it[1] > native_quant.MAX_ROWS]


_GROUPED_Q = custom_op(
    "cpu_grouped_quant", "(Tensor lhs, Tensor rhs, Tensor rhs_scale, Tensor group_sizes) -> Tensor",
    lambda lhs, rhs, rhs_scale, group_sizes: grouped_matmul_quantized(lhs, rhs, rhs_scale, sizes_list(group_sizes)),
    lambda lhs, rhs, rhs_scale, group_sizes: lhs.new_empty((lhs.shape[0], rhs.shape[2])))


def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    lhs, rhs, rhs_scale, group_sizes = inputs
    ctx.lhs_dtype = lhs.dtype
    ctx.save_for_backward(rhs, rhs_scale, group_sizes)


def _backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
    """d_lhs = dout @ dequant(rhs)^T per group, in float32 (the weights get no gradient: they are frozen)."""
    rhs, rhs_scale, group_sizes = ctx.saved_tensors
    if not ctx.needs_input_grad[0]:
        return None, None, None, None
    w_t = dequantize(rhs, rhs_scale).transpose(1, 2)  # [G, N, K] float32
    d_lhs = ragged_dot_torch(dout.to(torch.float32).contiguous(), w_t, group_sizes)
    return d_lhs.to(ctx.lhs_dtype), None, None, None


if not getattr(_GROUPED_Q, "_kernel_hub_autograd", False):
    _GROUPED_Q.register_autograd(_backward, setup_context=_setup)
    _GROUPED_Q._kernel_hub_autograd = True


def ragged_dot_quantized(lhs: torch.Tensor, rhs: torch.Tensor, rhs_scale: torch.Tensor | None,
                         group_sizes: torch.Tensor) -> torch.Tensor:
    """The quantized ragged dot (see the module docstring); shapes and group sizes already checked by the caller."""
    check_quantized(lhs, rhs, rhs_scale)
    assert rhs_scale is not None
    if compiling() or (torch.is_grad_enabled() and lhs.requires_grad):
        return _GROUPED_Q(lhs, rhs, rhs_scale, group_sizes)
    return grouped_matmul_quantized(lhs.detach(), rhs, rhs_scale, sizes_list(group_sizes))


def compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype an expert block computes in: the weights' own, or the hidden states' for quantized weights."""
    return hidden.dtype if weight.dtype in QUANTIZED_DTYPES else weight.dtype


def oriented_scale(scale: torch.Tensor | None, is_transposed: bool) -> torch.Tensor | None:
    """A weight's scale in the ragged dot's rhs orientation: scales are laid out like their weights, so a weight
    stored nn.Linear-style ([E, N, K], is_transposed=False) has its scale as [E, N, 1] / [E, ceil(N/128),
    ceil(K/128)] (transformers' weight_scale_inv) and is transposed with it."""
    if scale is None or is_transposed:
        return scale
    return scale.transpose(1, 2)


@functools.cache
def native_support(dtype: torch.dtype) -> tuple[bool, str]:
    """(does `dtype` take the native kernel here, why): for reports."""
    return native_quant.available(dtype)


def inference_fast_path(hidden_states: torch.Tensor, top_k_weights: torch.Tensor) -> bool:
    """Whether moe_experts may take moe_experts_quantized: CPU, eager, nothing to differentiate."""
    return (hidden_states.device.type == "cpu" and not compiling()
            and not (torch.is_grad_enabled() and (hidden_states.requires_grad or top_k_weights.requires_grad)))


def moe_experts_quantized(
    hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
    w_up: torch.Tensor, w_down: torch.Tensor, s_up: torch.Tensor, s_down: torch.Tensor, *,
    up_bias: torch.Tensor | None, down_bias: torch.Tensor | None,
    gate: Callable[[torch.Tensor], torch.Tensor], post_fn: Callable[[torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """torch_api.moe_experts with quantized weights on CPU at inference, the same computation step for step (the same
    products, bias, gate and combine in the same order and dtypes, so the same numbers), with the whole-tensor steps
    between the two grouped products run on one pool worker (torch_cpu.on_worker): in the caller they would fork
    OpenMP threads, which stall for milliseconds when another process holds a core (torch_packed's reason).
    w_up / w_down in the rhs orientation ([E, H, 2I] / [E, I, H]) with their rhs-oriented scales; no autograd."""
    num_experts = w_up.shape[0]
    num_tokens, top_k = top_k_index.shape
    dtype = hidden_states.dtype
    check_ragged_dot_shapes(hidden_states.shape, w_up.shape, (num_experts,))
    check_quantized(hidden_states, w_up, s_up)
    check_quantized(hidden_states, w_down, s_down)
    with torch.no_grad():
        sorted_ids, perm, sizes, in_range = route(top_k_index, num_experts)
        rows = perm.numel()
        counts = [int(s) for s in sizes.tolist()]
        covered = min(sum(counts), rows)
        ids = sorted_ids[:covered]
        h = grouped_matmul_quantized(hidden_states, w_up, s_up, counts, rows=perm[:covered] // top_k)

        def middle() -> torch.Tensor:
            y = h if up_bias is None else h + up_bias[ids]
            return gate(y).to(dtype).contiguous()

        h = on_worker(middle)
        check_ragged_dot_shapes(h.shape, w_down.shape, (num_experts,))
        out = grouped_matmul_quantized(h, w_down, s_down, counts)

        def tail() -> torch.Tensor:
            o = out if down_bias is None else out + down_bias[ids]
            if covered < rows:  # rows of dropped (sentinel) ids
                o = torch.cat([o, o.new_zeros((rows - covered, o.shape[1]))])
            return o if post_fn is None else post_fn(o)

        if down_bias is None and covered == rows and post_fn is None:
            result = out  # nothing to add: no round trip to a worker
        else:
            result = on_worker(tail) if post_fn is None else tail()
        return combine_experts(result, top_k_weights, perm, in_range, num_tokens, top_k, dtype)
