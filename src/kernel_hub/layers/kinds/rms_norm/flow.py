"""The rms_norm kind's flow over the jobs: find.find_norms -> load (the kernel) -> per norm validate.norm_form_errors,
plan.choose_form -> swap this instance's forward for a NormHook -> report rows; restore puts each forward back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...layer_check import tolerance_for
from ...load import kernel_for, kernel_info
from ...report import Kept, Replaced
from ...swap import CallCounts, put_back_forward, swap_forward
from ...weights_guard import KernelRefused, watched
from ..declaration import KindRun, KindStates
from .contract import NAME
from .find import find_norms, norm_epsilon
from .plan import FORMS, choose_form, form_name
from .validate import norm_form_errors

if TYPE_CHECKING:
    import torch


@dataclass
class NormHook(CallCounts):
    """The instance forward kernelize installs: the kernel in the matched form, the previous forward where the
    input's dtype is not the weight's (a case the validation did not cover; counted as a fallback, with why)."""

    kernel: Any
    module: torch.nn.Module
    previous: Any  # the forward that ran before (bound method or instance attribute)
    zero_centered: bool
    scale_after_cast: bool

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
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


def apply(run: KindRun) -> None:
    found, skipped = find_norms(run.model)
    if not found and not skipped:
        return
    loaded = kernel_for(run, runs_the_model=True)  # the form is read off the layer's outputs
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


def restore(model: torch.nn.Module, state: KindStates) -> None:
    del model
    norms: NormState | None = state.kinds.get(NAME)
    for module, previous in reversed(norms.swapped if norms else []):
        put_back_forward(module, previous)

