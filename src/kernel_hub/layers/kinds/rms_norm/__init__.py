"""Layer kind `rms_norm`: RMSNorm modules (transformers', Diffusers', torch.nn.RMSNorm), served by
kernel-hub/rms-norm-tpu's `rms_norm`.

Found by class name and structure (find.find_norms), whether or not HF kernels' `use_kernel_forward_from_hub`
decorator marked the class (transformers 5.25 with kernels 0.19.1 marks its Llama-style norms "RMSNorm" and Qwen3.5's
"RMSNormZeroCentered", not GPT-OSS's or Gemma's); Diffusers models reach this kind through the same declaration
(layers/diffusers.py). The form is read from the layer's own outputs, not its name: on random inputs, the kernel's
four variants (weight or 1 + weight; scale in float32 or after the cast to the input dtype) are compared with the
layer's current forward (validate.norm_form_errors) and the closest one is taken if it is within the dtype's tolerance
(plan.choose_form); otherwise the layer is kept with the errors. The swap is this instance's `forward` only
(swap.swap_forward, never a class or a module-level function); restore puts back exactly what was there.

The kind's folder: contract.py (its name, its kernel's Protocol), find.py, plan.py, validate.py, flow.py (apply /
restore over those jobs, and the instance forward it installs); this declaration. It imports the contract only, so
reading the kinds (the report's titles) imports no framework; the flow is imported when the kind runs.
"""

from __future__ import annotations

from ..declaration import LayerKind, deferred
from .contract import NAME, RMSNormKernel

KIND = LayerKind(
    name=NAME,
    title="RMSNorm",
    export="rms_norm",
    protocols=(RMSNormKernel,),
    finds="modules whose class is named like an RMSNorm (or marked 'RMSNorm' by HF kernels), not gated, with a 1-D "
          "weight, no bias and a numeric variance_epsilon or eps (transformers, Diffusers, torch.nn.RMSNorm)",
    contract="forward(hidden_states[..., H]) -> same shape and dtype: weight * x_normed or (1 + weight) * x_normed",
    validated_on="16 random rows (x 3) in the weight's dtype, each of the kernel's forms against the layer's forward "
                 "(training: and the gradients of x and weight); the closest form within tolerance is taken",
    apply=deferred(f"{__name__}.flow", "apply"),
    restore=deferred(f"{__name__}.flow", "restore"),
    order=2,
    hf_names=("RMSNorm",),  # transformers' use_kernel_forward_from_hub mark, HF kernels' layer name
)
