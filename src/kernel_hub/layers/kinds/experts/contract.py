"""The moe_experts kind's contract: its name (what kernel.yaml `replaces` and registry.yaml `layers` call it), the
Protocols its kernel keeps in its torch entry (tests/verify/test_kernel_contract.py holds every kernel that `replaces`
the kind to them), the optional packed-weights group, and transformers' experts-function convention a kernel may keep
instead. Typing only: importing this imports no framework."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ....verify.contract import Implementation, readable_signature

if TYPE_CHECKING:
    import torch

    #: An activation, gate or post-expert function: one tensor in, one out.
    TensorFn = Callable[[torch.Tensor], torch.Tensor]
    #: fn(module, hidden[T,H], top_k_index[T,K], top_k_weights[T,K]) -> [T,H]: an expert block's call.
    ExpertsCall = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    #: A kernel's `quantize(weight[G,K,N], dtype) -> (bytes, scale)`.
    QuantizeFn = Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]]
    #: A kernel's `advise_huge_pages(tensor) -> (bytes in 2 MiB pages, why not)`.
    AdviseFn = Callable[[torch.Tensor], tuple[int, str]]

NAME = "moe_experts"
#: The block attribute holding its ExpertsHook, which the registered experts function reads at call time.
HOOK_ATTR = "_kernel_hub_experts"


class ExpertsKernel(Protocol):
    """Layer kind `moe_experts`: transformers' expert block (`hidden[T,H], top_k_index[T,K], top_k_weights[T,K]` with
    the block's stacked weights as transformers stores them) -> `[T,H]` in the hidden states' dtype."""

    def ragged_dot(self, lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *,
                   preferred_element_type: torch.dtype | None = None,
                   implementation: Implementation = None) -> torch.Tensor:
        """Grouped matmul lhs[M,K] x rhs[G,K,N] by group_sizes[G] -> [M,N]."""
        ...

    def moe_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                    gate_up_proj: torch.Tensor, down_proj: torch.Tensor, *,
                    gate_up_proj_bias: torch.Tensor | None = None, down_proj_bias: torch.Tensor | None = None,
                    is_transposed: bool = False, is_concatenated: bool = True, has_gate: bool = True,
                    act: str | TensorFn | None = None, gate_fn: TensorFn | None = None,
                    post_fn: TensorFn | None = None) -> torch.Tensor:
        """A whole expert block: route, two ragged dots around the gate/activation, combine by the routing weights
        (ids >= E are dropped: expert-parallel sentinels)."""
        ...


class ExpertsFunctionKernel(Protocol):
    """Layer kind `moe_experts` in transformers' experts-function convention (what `ALL_EXPERTS_FUNCTIONS.register(name,
    fn)` takes): `experts_forward(module, hidden_states[T,H], top_k_index[T,K], top_k_weights[T,K]) -> [T,H]`, the
    experts module first (its weights, layout flags, gate and activation are its attributes). A kernel exporting only
    this serves the kind too (kernelize calls it positionally, as transformers does; `experts_function_problems`)."""

    def experts_forward(self, module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
        ...


class PackedWeight(Protocol):
    """What pack_experts returns: one stacked weight packed in place, and the ways back to a dense tensor."""

    @property
    def tensor(self) -> torch.Tensor:
        """The original weight (its shape, dtype and requires_grad are the placeholder's)."""
        ...

    @property
    def dtype(self) -> torch.dtype:
        ...

    @property
    def hint(self) -> int | None:
        """oneDNN's reorder batch hint the bytes are packed with (None: another packing, which `how` names)."""
        ...

    def unpack(self) -> torch.Tensor:
        """The original parameter back, bytes restored; the holder is spent."""
        ...

    def dense(self) -> torch.Tensor:
        """A dense copy in the original layout (the holder stays packed)."""
        ...


class PackedExpertsKernel(Protocol):
    """Optional beside ExpertsKernel, all three or none: expert weights prepared once for CPU inference (kernelize
    packs a frozen block's weights in place and runs `moe_experts_packed` on them, bit-identical to moe_experts)."""

    def pack_experts(self, weight: torch.Tensor, *, transposed: bool) -> PackedWeight:
        """Pack one stacked [E,·,·] weight in place; a holder with `.tensor`, `.dtype`, `.unpack()`, `.dense()`;
        raises (leaving the weight as it was) where it cannot."""
        ...

    def moe_experts_packed(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                           gate_up: PackedWeight, down: PackedWeight, *, gate_up_proj_bias: torch.Tensor | None = None,
                           down_proj_bias: torch.Tensor | None = None, is_concatenated: bool = True,
                           has_gate: bool = True, act: str | TensorFn | None = None, gate_fn: TensorFn | None = None,
                           post_fn: TensorFn | None = None) -> torch.Tensor:
        """moe_experts on two pack_experts holders (their layout is in the holders: no is_transposed)."""
        ...

    def packing_support(self, dtype: torch.dtype) -> tuple[bool, str]:
        """(can this process pack `dtype` expert weights, why)."""
        ...


#: What kernelize's CPU packing needs from a kernel (PackedExpertsKernel's entries).
PACKED_EXPERTS_ENTRIES = ("pack_experts", "moe_experts_packed", "packing_support")


def experts_function_problems(fn: object) -> list[str]:
    """Where `fn` cannot be called as transformers calls an experts function: four positional arguments (module,
    hidden_states, top_k_index, top_k_weights), nothing else required (empty: it can)."""
    if not callable(fn):
        return ["experts_forward: not callable"]
    sig = readable_signature(fn)
    if sig is None:
        return ["experts_forward: has no readable signature"]
    required_kw = [p.name for p in sig.parameters.values()
                   if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty]
    if required_kw:
        return [f"experts_forward: requires keyword parameter(s) {', '.join(required_kw)}, which transformers never "
                "passes"]
    try:
        sig.bind(None, None, None, None)
    except TypeError as exc:
        return [f"experts_forward: cannot be called as fn(module, hidden_states, top_k_index, top_k_weights): {exc}"]
    return []
