"""Layer kind `attention`: transformers attention through AttentionInterface (and Diffusers attention processors),
served by flash attention.

The kind's folder: contract.py (its name, its kernel's Protocol), find.py, plan.py (may the model switch),
validate.py (the forwards its layers are checked on), flow.py (apply / restore on a transformers model); the
transformers adapter by job: config_switch.py (the implementation names on a model's configs), dispatch.py (the
registered attention function: hook, probe, previous implementation), masks.py (reading the mask a layer gets),
call_plan.py (may the kernel compute this call, with which arguments), heads.py (one head size for q/k/v),
kernel_call.py (the kernel around the plan), packed.py (continuous batching's packed and paged calls); diffusers.py +
diffusers_route.py (the Diffusers adapter: attention processors); this declaration. It imports the contract only, so
reading the kinds (the report's titles) imports no framework; the flow and adapters are imported when the kind runs.
"""

from __future__ import annotations

from ..declaration import LayerKind, deferred
from .contract import NAME, AttentionKernel

KIND = LayerKind(
    name=NAME,
    title="attention",
    export="flash_attention",
    protocols=(AttentionKernel,),
    finds="every module that calls transformers' attention function (found by running the model once)",
    contract="transformers' attention call (module, query, key, value, attention_mask, ...) -> (out, None)",
    validated_on="a padded random batch through the model, each layer against its previous implementation",
    apply=deferred(f"{__name__}.flow", "apply"),
    restore=deferred(f"{__name__}.flow", "restore"),
    order=1,
    # Diffusers: each attention processor wrapped (diffusers.py, diffusers_route.py)
    diffusers=(deferred(f"{__name__}.diffusers", "kernelize_attention_processors"),
               deferred(f"{__name__}.diffusers", "restore_attention_processors")),
)
