"""The moe_experts kind's contract: its name (what kernel.yaml `replaces` and registry.yaml `layers` call it), the
Protocols its kernel keeps in its torch entry (tests/verify/test_kernel_contract.py holds every kernel that `replaces`
the kind to them), the optional packed-weights group, and transformers' experts-function convention a kernel may keep
instead. Typing only: importing this imports no framework."""

from __future__ import annotations

import inspect
from typing import Any, Protocol

from ....verify.contract import Implementation, readable_signature

NAME = "moe_experts"
#: The block attribute holding its ExpertsHook, which the registered experts function reads at call time.
HOOK_ATTR = "_kernel_hub_experts"


class ExpertsKernel(Protocol):
    """Layer kind `moe_experts`: transformers' expert block (`hidden[T,H], top_k_index[T,K], top_k_weights[T,K]` with
    the block's stacked weights as transformers stores them) -> `[T,H]` in the hidden states' dtype."""

    def ragged_dot(self, lhs: Any, rhs: Any, group_sizes: Any, *, preferred_element_type: Any = None,
                   implementation: Implementation = None) -> Any:
        """Grouped matmul lhs[M,K] x rhs[G,K,N] by group_sizes[G] -> [M,N]."""
        ...

    def moe_experts(self, hidden_states: Any, top_k_index: Any, top_k_weights: Any, gate_up_proj: Any,
                    down_proj: Any, *, gate_up_proj_bias: Any = None, down_proj_bias: Any = None,
                    is_transposed: bool = False, is_concatenated: bool = True, has_gate: bool = True,
                    act: Any = None, gate_fn: Any = None, post_fn: Any = None) -> Any:
        """A whole expert block: route, two ragged dots around the gate/activation, combine by the routing weights
        (ids >= E are dropped: expert-parallel sentinels)."""
        ...


class ExpertsFunctionKernel(Protocol):
    """Layer kind `moe_experts` in transformers' experts-function convention (what `ALL_EXPERTS_FUNCTIONS.register(name,
    fn)` takes): `experts_forward(module, hidden_states[T,H], top_k_index[T,K], top_k_weights[T,K]) -> [T,H]`, the
    experts module first (its weights, layout flags, gate and activation are its attributes). A kernel exporting only
    this serves the kind too (kernelize calls it positionally, as transformers does; `experts_function_problems`)."""

    def experts_forward(self, module: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
        ...


class PackedExpertsKernel(Protocol):
    """Optional beside ExpertsKernel, all three or none: expert weights prepared once for CPU inference (kernelize
    packs a frozen block's weights in place and runs `moe_experts_packed` on them, bit-identical to moe_experts)."""

    def pack_experts(self, weight: Any, *, transposed: bool) -> Any:
        """Pack one stacked [E,·,·] weight in place; a holder with `.tensor`, `.dtype`, `.unpack()`, `.dense()`;
        raises (leaving the weight as it was) where it cannot."""
        ...

    def moe_experts_packed(self, hidden_states: Any, top_k_index: Any, top_k_weights: Any, gate_up: Any, down: Any,
                           *, gate_up_proj_bias: Any = None, down_proj_bias: Any = None, is_concatenated: bool = True,
                           has_gate: bool = True, act: Any = None, gate_fn: Any = None, post_fn: Any = None) -> Any:
        """moe_experts on two pack_experts holders (their layout is in the holders: no is_transposed)."""
        ...

    def packing_support(self, dtype: Any) -> tuple[bool, str]:
        """(can this process pack `dtype` expert weights, why)."""
        ...


#: What kernelize's CPU packing needs from a kernel (PackedExpertsKernel's entries).
PACKED_EXPERTS_ENTRIES = ("pack_experts", "moe_experts_packed", "packing_support")


def experts_function_problems(fn: Any) -> list[str]:
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
