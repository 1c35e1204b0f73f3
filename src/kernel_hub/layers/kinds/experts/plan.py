"""The moe_experts kind's decisions, each a pure function with its reason (like the generic ones in layers/plan.py):
which convention a kernel serves the kind through, and whether a replaced block's expert weights are packed. The
facts come in as arguments; importing this imports no framework.
"""

from __future__ import annotations

from .contract import PACKED_EXPERTS_ENTRIES, experts_function_problems

#: Set to "0" to keep every expert block unpacked (packing.py reads it).
PACK_ENV = "KERNEL_HUB_CPU_PACK"

# --- which convention a kernel serves it through --------------------------------------------------------------------

#: The conventions a moe_experts kernel may keep, in the order kernelize prefers them: ours (contract.py ExpertsKernel:
#: `moe_experts`, or a bare `ragged_dot` kernelize builds the block on), then transformers' experts functions.
EXPERTS_CONVENTIONS = ("moe_experts", "ragged_dot", "experts_forward")


def experts_convention(kernel: object) -> tuple[str | None, str]:
    """(the convention kernelize runs `kernel` through for moe_experts, why), or (None, why none): ours where the
    kernel keeps it (it also carries packing and quantized weights), else transformers' `experts_forward(self,
    hidden_states, top_k_index, top_k_weights)` when it can be called that way."""
    for name in EXPERTS_CONVENTIONS[:2]:
        if callable(getattr(kernel, name, None)):
            return name, f"exports {name} (kernel-hub's moe_experts contract)"
    fn = getattr(kernel, "experts_forward", None)
    if fn is None:
        return None, f"exports none of {', '.join(EXPERTS_CONVENTIONS)}"
    problems = experts_function_problems(fn)
    if problems:
        return None, f"its experts_forward is not transformers' experts function: {'; '.join(problems)}"
    return "experts_forward", "exports experts_forward (transformers' experts-function convention)"


# --- packed CPU weights ---------------------------------------------------------------------------------------------


def decide_packing(
    *, mode: str, device_type: str, dtype: str, requires_grad: bool, kernel_exports: bool,
    support: tuple[bool, str] | None, enabled: bool,
) -> tuple[bool, str]:
    """(pack this block's expert weights, why). Every fact about the system comes in as an argument.

    support: the kernel's packing_support(dtype) answer (None when the kernel cannot be asked)."""
    if not enabled:
        return False, f"not packed: disabled by {PACK_ENV}=0"
    if mode != "inference":
        return False, f"not packed: mode={mode!r} (packed weights are inference-only)"
    if requires_grad:
        return False, ("not packed: expert weights require grad (packed weights are inference-only; "
                       "model.requires_grad_(False) before kernelize packs them)")
    if device_type != "cpu":
        return False, f"not packed: weights on {device_type} (packing is for CPU)"
    if not kernel_exports or support is None:
        return False, ("not packed: the kernel exports no packed-weights entry ("
                       + ", ".join(PACKED_EXPERTS_ENTRIES) + ")")
    ok, why = support
    if not ok:
        return False, f"not packed: {why}"
    return True, f"{dtype}, inference, frozen weights; {why}"
