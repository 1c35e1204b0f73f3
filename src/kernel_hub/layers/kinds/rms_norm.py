"""Layer kind `rms_norm`: RMSNorm modules (transformers', Diffusers', torch.nn.RMSNorm), served by
kernel-hub/rms-norm-tpu's `rms_norm`.

The declaration, and the kind's flow over the jobs. Found by class name and structure (find.find_norms), whether or
not HF kernels' `use_kernel_forward_from_hub` decorator marked the class (transformers 5.25 with kernels 0.19.1 marks
its Llama-style norms "RMSNorm" and Qwen3.5's "RMSNormZeroCentered", not GPT-OSS's or Gemma's); Diffusers models
reach this kind through the same declaration (layers/diffusers.py). The form is read from the layer's own outputs,
not its name: on random inputs, the kernel's four variants (weight or 1 + weight; scale in float32 or after the cast
to the input dtype) are compared with the layer's current forward (validate.norm_form_errors) and the closest one is
taken if it is within the dtype's tolerance (plan.choose_form); otherwise the layer is kept with the errors. The swap
is this instance's `forward` only (swap.swap_forward, never a class or a module-level function); restore puts back
exactly what was there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..find import find_norms, norm_epsilon
from ..load import kernel_for, kernel_info
from ..plan import FORMS, choose_form, form_name
from ..report import Kept, Replaced
from ..swap import CallCounts, put_back_forward, swap_forward
from ..validate import norm_form_errors, tolerance_for
from ..weights_guard import KernelRefused, watched
from . import KindRun, LayerKind

NAME = "rms_norm"
__all__ = ["KIND", "NAME", "NormHook", "NormState", "choose_form"]


@dataclass
class NormHook(CallCounts):
    """The instance forward kernelize installs: the kernel in the matched form, the previous forward where the
    input's dtype is not the weight's (a case the validation did not cover; counted as a fallback, with why)."""

    kernel: Any
    module: Any
    previous: Any  # the forward that ran before (bound method or instance attribute)
    zero_centered: bool
    scale_after_cast: bool

    def __call__(self, hidden_states: Any) -> Any:
        weight = self.module.weight
        if hidden_states.dtype != weight.dtype:
            self.fell_back(f"input dtype {hidden_states.dtype} is not the weight's {weight.dtype} (validated on the "
                           "weight's dtype)")
            return self.previous(hidden_states)
        self.served()
        with watched(self.module):  # the kernel never writes the norm's weight
            return self.kernel.rms_norm(hidden_states, weight, eps=norm_epsilon(self.module),
                                        zero_centered=self.zero_centered, scale_after_cast=self.scale_after_cast)


@dataclass
class NormState:
    """For restore: each swapped module and what its instance __dict__ held under `forward` before."""

    swapped: list[tuple[Any, Any]] = field(default_factory=list)


def _apply(run: KindRun) -> None:
    found, skipped = find_norms(run.model)
    if not found and not skipped:
        return
    loaded = kernel_for(run, NAME, runs_the_model=True)  # the form is read off the layer's outputs
    if loaded is None:
        return
    kernel, repo_id = loaded
    info = kernel_info(kernel, run.device, "rms_norm")
    run.report.kept += [Kept(path, NAME, why) for path, why in skipped]
    state = run.state.kinds[NAME] = NormState()
    for i, (path, module) in enumerate(found):
        tol = tolerance_for(module.weight.dtype)
        try:
            errors = norm_form_errors(module, kernel, norm_epsilon(module), run.mode, seed=i)
        except KernelRefused as exc:  # wrote to the weight (put back), or returned another dtype / shape
            run.report.kept.append(Kept(path, NAME, str(exc)))
            continue
        except Exception as exc:  # a kernel (or layer) that raises keeps the layer as it is
            run.report.kept.append(Kept(path, NAME, f"kernel raised in validation: {type(exc).__name__}: {exc}"))
            continue
        index, why = choose_form(errors, tol if run.validate else float("inf"))
        if index is None:
            run.report.kept.append(Kept(path, NAME, why))
            continue
        zc, sac = FORMS[index]
        hook = NormHook(kernel, module, module.forward, zc, sac)
        state.swapped.append((module, swap_forward(module, hook)))
        run.report.replaced.append(Replaced(
            layer=path, kind=NAME, repo_id=repo_id, version=info["version"], commit=info["commit"],
            variant=info["variant"], implementation=info["implementation"], route="forward",
            layout=f"hidden {module.weight.shape[0]}, {str(module.weight.dtype).removeprefix('torch.')}, "
                   f"{form_name(zc, sac)}",
            max_error=errors[index] if run.validate else None, tolerance=tol if run.validate else None, why=why))
    if not state.swapped:
        run.state.kinds.pop(NAME, None)


def _restore(model: Any, state: Any) -> None:
    del model
    norms: NormState | None = state.kinds.get(NAME)
    for module, previous in reversed(norms.swapped if norms else []):
        put_back_forward(module, previous)


KIND = LayerKind(
    name=NAME,
    export="rms_norm",
    finds="modules whose class is named like an RMSNorm (or marked 'RMSNorm' by HF kernels), not gated, with a 1-D "
          "weight, no bias and a numeric variance_epsilon or eps (transformers, Diffusers, torch.nn.RMSNorm)",
    contract="forward(hidden_states[..., H]) -> same shape and dtype: weight * x_normed or (1 + weight) * x_normed",
    validated_on="16 random rows (x 3) in the weight's dtype, each of the kernel's forms against the layer's forward "
                 "(training: and the gradients of x and weight); the closest form within tolerance is taken",
    apply=_apply,
    restore=_restore,
    order=2,
)
