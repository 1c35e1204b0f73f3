"""Layer kind `moe_experts`: a transformers Mixture-of-Experts expert block, served by the ragged dot.

The machinery lives in layers/api.py (`_kernelize_experts`, `_restore_experts`), layers/families.py (finding and
reading the blocks) and layers/experts.py (the hook); this module declares it.
"""

from __future__ import annotations

from typing import Any

from . import KindRun, LayerKind


def _apply(run: KindRun) -> None:
    from ..api import _kernelize_experts

    _kernelize_experts(run.model, run.spec, run.backend, run.device, run.mode, run.validate, run.state, run.report)


def _restore(model: Any, state: Any) -> None:
    from ..api import _restore_experts

    _restore_experts(model, state)


KIND = LayerKind(
    name="moe_experts",
    export="ragged_dot",
    finds="expert blocks families.find_experts recognises (transformers' ExpertsInterface blocks and known layouts)",
    contract="(hidden[T,H], top_k_index[T,K], top_k_weights[T,K]) -> [T,H], the block's own weights and activation",
    validated_on="16 random tokens routed to random experts, in the block's dtype (training: and the gradients)",
    apply=_apply,
    restore=_restore,
    order=0,
    diffusers="Diffusers denoisers have no transformers expert blocks (ExpertsInterface) to find",
)
