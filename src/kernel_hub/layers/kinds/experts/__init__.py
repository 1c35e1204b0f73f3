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

from typing import TYPE_CHECKING

from ....lazy import lazy_names
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
    hf_names=("MegaBlocksMoeMLP", "MoEExperts"),  # HF kernels' MoE layer classes
    # transformers' experts classes (Qwen3MoeExperts, MixtralExperts, GptOssExperts, ...): KernelConfig's keys for MoE
    hf_pattern=(r"^[A-Z][A-Za-z0-9]*Experts$", "<Family>Experts"),
    quantizes=deferred(f"{__name__}.quantize", "check_quantize"),
)

if TYPE_CHECKING:  # the kind's public names (`x as x`: a re-export); at run time they load on first use (torch)
    from .find import ExpertsLayout as ExpertsLayout
    from .find import ExpertsSite as ExpertsSite
    from .find import find_experts as find_experts
    from .find import read_experts as read_experts
    from .validate import validate_layer as validate_layer

_LAZY = {"ExpertsLayout": "find", "ExpertsSite": "find", "find_experts": "find", "read_experts": "find",
         "validate_layer": "validate"}
__all__ = ["KIND", *sorted(_LAZY)]

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
