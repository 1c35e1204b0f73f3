"""A toy layer kind declared outside kernel_hub: `scale` layers (y = x * weight), as a user would add a kind.

Everything it needs is this folder (contract.py, find.py, validate.py, flow.py, this declaration) plus its kernel's
kernel.yaml `replaces: [scale]` (tests/fixtures/scale_layer_kernel); tests/layers/test_layer_kind_toy.py hands it to
kernelize with `kinds=` and holds kernel_hub.layers.kinds' list of what a kind needs to what this one needed.
"""

from __future__ import annotations

from kernel_hub.layers.kinds import LayerKind

from .contract import NAME, ScaleKernel
from .flow import apply, restore

KIND = LayerKind(
    name=NAME,
    title="scale layers",
    export="scale_layer",
    protocols=(ScaleKernel,),
    finds="modules whose class is named like a Scale, with a 1-D weight and nothing else",
    contract="forward(x[..., H]) -> x * weight, x's shape and dtype",
    validated_on="8 random rows in the weight's dtype, against the layer's own forward",
    apply=apply,
    restore=restore,
    order=3,
)
