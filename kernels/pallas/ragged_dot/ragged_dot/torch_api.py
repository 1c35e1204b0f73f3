"""Torch-facing entry of the ragged-dot kernel (the package __init__ of the torch-* builds).

`ragged_dot(lhs, rhs, group_sizes)` has jax.lax.ragged_dot's contract on torch tensors: lhs[M,K]
rows grouped contiguously by group, rhs[G,K,N], group_sizes[G] integer; out[M,N], rows past
sum(group_sizes) zero. `moe_experts(...)` is a whole Mixture-of-Experts expert block (route, two
grouped matmuls, gate, combine) with the weight layouts transformers uses; `experts_forward(self,
hidden_states, top_k_index, top_k_weights)` is the same block in transformers' experts-function convention
(hf_experts.py). `layers` holds HF kernels' layer classes (`MegaBlocksMoeMLP`) built on it.

Where it runs (the kernel contract's `implementation=`, docs/kernel-contract.md): tensors on CPU take
the torch-native path first (torch_cpu/; jax is never imported, so the torch-cpu build runs where
only torch is installed); on CUDA or TPU the JAX package's ragged_dot first (torch_bridge.py): through
DLPack on CUDA, as the TorchTPU op `kernel_hub_ragged_dot_<version, digest>::ragged_dot` on TPU tensors (the
torch-tpu build's entry, torch_tpu_api.py, registers it). Both are differentiable through torch autograd.
Quantized weights (rhs_scale) dispatch the same way: "torch" is torch_cpu/quantized_ragged_dot.py, "jax" the JAX
kernel with rhs_scale (on TPU the op `<namespace>::ragged_dot_quantized`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from . import layers
from ._vendor.group_sizes import check_group_sizes
from ._vendor.shapes import check_ragged_dot_shapes
from ._vendor.torch_dispatch import IMPLEMENTATIONS, ORDER, TorchDispatch
from ._vendor.torch_tpu_ops import op_namespace, package_digest
from .hf_experts import DISPATCH as _EXPERTS_DISPATCH
from .hf_experts import experts_forward
from .release import VERSION
from .torch_cpu.grouped import activate, combine_experts, num_workers, ragged_dot_torch, route
from .torch_cpu.huge_pages import advise_huge_pages
from .torch_cpu.packed import PackedExperts, PackingError, moe_experts_packed, pack_experts, packing_support
from .torch_cpu.quant_format import QUANTIZED_DTYPES, check_quantized, dequantize, quantize
from .torch_cpu.quantized_ragged_dot import (
    compute_dtype,
    inference_fast_path,
    moe_experts_quantized,
    oriented_scale,
    ragged_dot_quantized,
)

__all__ = [
    "IMPLEMENTATIONS",
    "ORDER",
    "PackedExperts",
    "PackingError",
    "advise_huge_pages",
    "dequantize",
    "describe",
    "experts_forward",
    "implementations_for",
    "last_implementation",
    "layers",
    "moe_experts",
    "moe_experts_packed",
    "pack_experts",
    "packing_support",
    "quantize",
    "ragged_dot",
    "resolve_implementation",
]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}

_NAMESPACE = op_namespace("ragged_dot", VERSION, package_digest(Path(__file__).parent))
_DISPATCH = TorchDispatch("ragged_dot", native=lambda: f"torch-native grouped loop ({num_workers()} workers)",
                          tpu_op=f"{_NAMESPACE}::ragged_dot")
#: Every dispatch of this entry (the torch-tpu build's entry hooks its device notice into each).
DISPATCHES = (_DISPATCH, _EXPERTS_DISPATCH)
implementations_for, resolve_implementation, last_implementation, describe = _DISPATCH.exports()


def _checked_group_sizes(group_sizes: torch.Tensor, m: int) -> torch.Tensor:
    """The JAX entries' rule (_vendor/ragged_operands.py): concrete sizes that are negative or sum past M raise a
    ValueError naming group_sizes; sizes without values (meta, fake, traced by torch.compile) are normalised the same
    way as there: negative counts as 0, rows in group order, cut at M."""
    concrete = not torch.compiler.is_compiling() and group_sizes.device.type != "meta" and not _is_fake(group_sizes)
    if concrete:  # under torch.compile (dynamo) the values are symbolic: normalise, never read them
        check_group_sizes(group_sizes.tolist(), m)
        return group_sizes
    ends = torch.clamp(torch.cumsum(torch.clamp(group_sizes, min=0), 0), max=m)
    return torch.diff(ends, prepend=ends.new_zeros(1))


def _is_fake(t: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # pragma: no cover - older torch
        return False
    return bool(is_fake(t))


def ragged_dot(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    group_sizes: torch.Tensor,
    *,
    rhs_scale: torch.Tensor | None = None,
    preferred_element_type: torch.dtype | None = None,
    implementation: str | Sequence[str] | None = None,
) -> torch.Tensor:
    """Grouped matmul: out[r] = lhs[r] @ rhs[g(r)] with rows grouped contiguously by group_sizes.

    rhs_scale: quantized weights (torch_cpu/quantized_ragged_dot.py): rhs int8 with [G, 1, N] per-channel scales, or
    float8_e4m3fn with [G, ceil(K/128), ceil(N/128)] block scales, float32; lhs bfloat16/float32; the result in lhs's
    dtype unless preferred_element_type names another; gradients in lhs only. Dispatched like unquantized weights:
    "torch" is torch_cpu/quantized_ragged_dot.py (the native CPU kernel, else one expert dequantized at a time), "jax"
    the JAX ragged_dot with rhs_scale through the bridge (on TPU the Pallas kernel that dequantizes in VMEM, so HBM
    moves the 1-byte weights). Arguments are checked here first, so both raise the same ValueError naming the
    argument.

    The JAX entry's dtype policy: the result has `preferred_element_type`, else lhs's dtype; lhs and rhs of
    different dtypes are computed in their promoted dtype. implementation: "torch" (native) or "jax" (the
    Pallas/XLA kernel through the bridge), a name or a sequence tried in order; None: implementations_for(device).
    """
    check_ragged_dot_shapes(lhs.shape, rhs.shape, group_sizes.shape)
    if group_sizes.dtype.is_floating_point or group_sizes.dtype.is_complex or group_sizes.dtype == torch.bool:
        raise TypeError(f"group_sizes must be integers, got {group_sizes.dtype}")
    group_sizes = _checked_group_sizes(group_sizes, lhs.shape[0])
    out_dtype = preferred_element_type or lhs.dtype
    if rhs_scale is not None or rhs.dtype in QUANTIZED_DTYPES:
        check_quantized(lhs, rhs, rhs_scale)  # one ValueError naming the argument, whichever implementation runs
        assert rhs_scale is not None  # check_quantized refuses None
        scale: torch.Tensor = rhs_scale

        def call_quantized(name: str) -> torch.Tensor:
            if name == "torch":
                return ragged_dot_quantized(lhs, rhs, scale, group_sizes)
            from .torch_bridge import ragged_dot_quantized_jax

            return ragged_dot_quantized_jax(lhs, rhs, scale, group_sizes, preferred_element_type=out_dtype)

        return _DISPATCH.run(lhs.device, implementation, call_quantized).to(out_dtype)
    compute = torch.promote_types(lhs.dtype, rhs.dtype)
    lhs, rhs = lhs.to(compute), rhs.to(compute)

    def call(name: str) -> torch.Tensor:
        if name == "torch":
            return ragged_dot_torch(lhs, rhs, group_sizes)
        from .torch_bridge import ragged_dot_jax

        return ragged_dot_jax(lhs, rhs, group_sizes, preferred_element_type=out_dtype)

    return _DISPATCH.run(lhs.device, implementation, call).to(out_dtype)


def moe_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    *,
    gate_up_proj_bias: torch.Tensor | None = None,
    down_proj_bias: torch.Tensor | None = None,
    is_transposed: bool = False,
    is_concatenated: bool = True,
    has_gate: bool = True,
    act: str | Callable[[torch.Tensor], torch.Tensor] = "silu",
    gate_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    post_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    implementation: str | Sequence[str] | None = None,
    w_gate_up_scale: torch.Tensor | None = None,
    w_down_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """A Mixture-of-Experts expert block on two ragged dots.

    hidden_states[T,H]; top_k_index[T,K] expert ids (ids >= E are dropped: expert-parallel
    sentinels); top_k_weights[T,K]. Weights as transformers stores them: is_transposed=False means
    gate_up_proj[E, 2I, H] and down_proj[E, H, I] (nn.Linear style), True means [E, H, 2I] and
    [E, I, H]. is_concatenated: gate and up halves stacked [gate; up]; False: interleaved
    (g0, u0, g1, u1, ...). has_gate=False: gate_up_proj is a plain up projection and `act` is
    applied to it. gate_fn replaces the default act(gate) * up (e.g. a clamped SwiGLU); post_fn runs
    on each expert output before the routing weight (a post-expert norm). Returns [T,H] in the
    hidden_states dtype. w_gate_up_scale / w_down_scale: the scales of int8 / float8_e4m3fn weights, laid out like
    their weights (ragged_dot's rhs_scale rule in the [E, K, N] orientation; transposed with nn.Linear-style weights:
    [E, N, 1] or transformers' weight_scale_inv [E, ceil(N/128), ceil(K/128)]); the block then computes in the
    hidden_states dtype. Quantized, both projections follow `implementation` like ragged_dot (on TPU the JAX kernel
    through the bridge); CPU inference with "torch" chosen takes torch_cpu/quantized_ragged_dot.py
    moe_experts_quantized instead (the same products, its glue on a pool worker).
    """
    num_experts = gate_up_proj.shape[0]
    num_tokens, top_k = top_k_index.shape
    dtype = compute_dtype(hidden_states, gate_up_proj)
    act_fn = _ACTIVATIONS[act] if isinstance(act, str) else act

    w_up = gate_up_proj if is_transposed else gate_up_proj.transpose(1, 2)  # [E, H, 2I]
    w_down = down_proj if is_transposed else down_proj.transpose(1, 2)  # [E, I, H]
    s_up, s_down = oriented_scale(w_gate_up_scale, is_transposed), oriented_scale(w_down_scale, is_transposed)
    if (s_up is not None and inference_fast_path(hidden_states, top_k_weights)  # quantized, CPU inference
            and resolve_implementation(hidden_states.device, implementation)[0] == "torch"):
        gate = functools.partial(activate, act=act_fn, has_gate=has_gate, concatenated=is_concatenated, gate_fn=gate_fn)
        return moe_experts_quantized(hidden_states, top_k_index, top_k_weights, w_up, w_down, s_up, s_down,
                                     up_bias=gate_up_proj_bias, down_bias=down_proj_bias, gate=gate, post_fn=post_fn)
    sorted_ids, perm, sizes, in_range = route(top_k_index, num_experts)  # sentinel rows come out zero
    x = hidden_states[perm // top_k].to(dtype)
    safe_ids = sorted_ids.clamp(max=num_experts - 1)

    h = ragged_dot(x, w_up, sizes, rhs_scale=s_up, implementation=implementation)
    if gate_up_proj_bias is not None:
        h = h + gate_up_proj_bias[safe_ids]
    h = activate(h, act=act_fn, has_gate=has_gate, concatenated=is_concatenated, gate_fn=gate_fn)
    out = ragged_dot(h.to(dtype), w_down, sizes, rhs_scale=s_down, implementation=implementation)
    if down_proj_bias is not None:
        out = out + down_proj_bias[safe_ids]
    if post_fn is not None:
        out = post_fn(out)
    return combine_experts(out, top_k_weights, perm, in_range, num_tokens, top_k, hidden_states.dtype)
