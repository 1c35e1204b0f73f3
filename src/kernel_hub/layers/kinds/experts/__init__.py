"""Layer kind `moe_experts`: a transformers Mixture-of-Experts expert block, served by the ragged dot, or by any kernel
in transformers' experts-function convention (`experts_forward(self, hidden_states, top_k_index, top_k_weights)`;
plan.experts_convention says which convention a kernel runs through, and every report row names it).

The kind's folder: contract.py (its name, its kernel's Protocols), find.py (blocks and their layouts), plan.py
(which convention, pack or not), validate.py, flow.py (apply / restore over those jobs), transformers.py (the adapter:
the "kernel_hub" experts implementation and its per-block hooks), packing.py + packed_op.py (CPU packed expert
weights, and their torch.compile op), quantize.py (kernelize(quantize=)); this declaration. It imports the contract
and plan (framework-free) only, so reading the kinds (the report's titles) imports no framework; the flow and
adapters are imported when the kind runs.
"""

from __future__ import annotations

from ..declaration import LayerKind, deferred
from .contract import NAME, ExpertsKernel, PackedExpertsKernel
from .plan import experts_convention

KIND = LayerKind(
    name=NAME,
    title="experts",
    export="ragged_dot",  # or moe_experts, or transformers' experts_forward: plan.experts_convention (`accepts`)
    protocols=(ExpertsKernel,),
    optional=(PackedExpertsKernel,),
    finds="expert blocks find.find_experts recognises (transformers' ExpertsInterface blocks and known layouts)",
    contract="(hidden[T,H], top_k_index[T,K], top_k_weights[T,K]) -> [T,H], the block's own weights and activation",
    validated_on="16 random tokens routed to random experts, in the block's dtype (training: and the gradients)",
    apply=deferred(f"{__name__}.flow", "apply"),
    restore=deferred(f"{__name__}.flow", "restore"),
    order=0,
    diffusers="Diffusers denoisers have no transformers expert blocks (ExpertsInterface) to find",
    accepts=experts_convention,
)
