"""The scale kind's flow: find -> load (kernel_for) -> validate each layer -> swap its instance forward -> report
rows; restore puts each forward back exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernel_hub.layers.kinds import KindRun
from kernel_hub.layers.layer_check import tolerance_for
from kernel_hub.layers.load import kernel_for, kernel_info
from kernel_hub.layers.plan import verdict
from kernel_hub.layers.report import Kept, Replaced
from kernel_hub.layers.swap import CallCounts, put_back_forward, swap_forward

from .contract import NAME
from .find import find_scales
from .validate import scale_error


@dataclass
class ScaleHook(CallCounts):
    """The instance forward kernelize installs on a scale layer: the kernel on the layer's own weight."""

    kernel: Any
    module: Any

    def __call__(self, x: Any) -> Any:
        self.served()
        return self.kernel.scale_layer(x, self.module.weight)


@dataclass
class ScaleState:
    """For restore: each swapped module and what its instance __dict__ held under `forward` before."""

    swapped: list[tuple[Any, Any]] = field(default_factory=list)


def apply(run: KindRun) -> None:
    found = find_scales(run.model)
    if not found:
        return
    loaded = kernel_for(run, runs_the_model=False)
    if loaded is None:
        return
    kernel, repo_id = loaded
    info = kernel_info(kernel, run.device, "scale_layer")
    state = run.state.kinds[NAME] = ScaleState()
    for i, (path, module) in enumerate(found):
        tol = tolerance_for(module.weight.dtype)
        err = scale_error(module, kernel, seed=i) if run.validate else None
        why = verdict(err, tol) if run.validate else ""
        if why:
            run.report.kept.append(Kept(path, NAME, why))
            continue
        state.swapped.append((module, swap_forward(module, ScaleHook(kernel, module))))
        run.report.replaced.append(Replaced(
            layer=path, kind=NAME, repo_id=repo_id, version=info["version"], commit=info["commit"],
            variant=info["variant"], implementation=info["implementation"], route="forward",
            layout=f"hidden {module.weight.shape[0]}", max_error=err, tolerance=tol if run.validate else None))
    if not state.swapped:
        run.state.kinds.pop(NAME, None)


def restore(model: Any, state: Any) -> None:
    del model
    scales: ScaleState | None = state.kinds.get(NAME)
    for module, previous in reversed(scales.swapped if scales else []):
        put_back_forward(module, previous)
