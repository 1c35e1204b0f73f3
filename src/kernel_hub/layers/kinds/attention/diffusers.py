"""The Diffusers adapter of the attention kind: its apply / restore on a Diffusers denoiser (the declaration's
`diffusers` pair; layers/diffusers.py runs it on each denoiser, a model's or a pipeline's).

Every attention module (anything with `processor` and `set_processor`) -> install `AttentionRoute`
(diffusers_route.py) in probe mode -> one validation call of the module on random hidden states of its own widths
(plus encoder states for joint / cross attention): each sdpa call runs torch's and the kernel on the same q/k/v,
keeping torch's -> keep the route where the kernel matched within the dtype tolerance, put the original processor back
(with the reason) where it did not, or where the processor never called sdpa. Restore puts each original processor
object back. Nothing here imports diffusers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...layer_check import TOLERANCE, dtype_device
from ...load import kernel_for, kernel_info
from ...plan import verdict
from ...report import Kept, KernelizeReport, Replaced
from ..declaration import KindRun
from .contract import NAME as LAYER_KIND
from .diffusers_route import AttentionRoute, SdpaProbe
from .find import diffusers_attention_modules as attention_modules
from .find import encoder_width
from .validate import diffusers_attention_call

if TYPE_CHECKING:
    from ...diffusers import DiffusersState


def _layout(module: torch.nn.Module, route: AttentionRoute, probe: SdpaProbe) -> str:
    (q, k), kind = probe.shapes[0], "self"
    if isinstance(getattr(module, "add_k_proj", None), torch.nn.Linear):
        kind = "joint"
    elif encoder_width(module) is not None:
        kind = "cross"
    heads = f"heads {q[-3]}/{k[-3]}" if len(q) == 4 else f"{q[0]} heads x batch"
    return f"{type(route.original).__name__}: {kind}, {heads}, d{q[-1]}"


def _validate(module: torch.nn.Module, route: AttentionRoute, seed: int) -> SdpaProbe:
    """Probe the module's calls: first as its projections suggest (encoder_width), then, for processors
    that always concatenate encoder states (CogVideoX, CogView4, Lumina2 style), with encoder states of
    the query's width."""
    first = encoder_width(module)
    to_q = getattr(module, "to_q", None)
    tries = [first] + ([to_q.in_features] if first is None and isinstance(to_q, torch.nn.Linear) else [])
    error = ""
    for encoder in tries:
        route.probe = probe = SdpaProbe()
        try:
            diffusers_attention_call(module, encoder, seed)
        except Exception as exc:  # the module could not run this call: the next try, or kept with the reason
            error = error or f"validation call failed: {type(exc).__name__}: {exc}"
            continue
        finally:
            route.probe = None
        return probe
    return SdpaProbe(failure=error)


def _where_attention_ran(processor: Any) -> str:
    if not hasattr(processor, "_attention_backend"):
        return "it computes attention itself, not through Diffusers' dispatcher"
    backend = processor._attention_backend
    if backend is None:
        return "attention backend: the dispatcher's active one"
    return f"attention backend: {getattr(backend, 'value', backend)}"


def _keep_reason(route: AttentionRoute, probe: SdpaProbe, validate: bool, tol: float) -> str:
    """Why this module keeps its processor after its validation call ("" if the route stays)."""
    if probe.failure:
        return probe.failure
    if not probe.shapes:
        return (f"{type(route.original).__name__} did not call torch scaled_dot_product_attention "
                f"({_where_attention_ran(route.original)})")
    return verdict(max(probe.errors), tol) if validate else ""


def _static_reason(module: torch.nn.Module) -> str:
    """Modules kernelize leaves alone before trying them."""
    processor = module.processor
    if isinstance(processor, AttentionRoute):
        return "already routed by another kernelize"
    if isinstance(processor, torch.nn.Module):
        return f"{type(processor).__name__} holds weights (a torch module): left in place"
    if getattr(processor, "_parallel_config", None) is not None:
        return "context parallelism is enabled on this processor"
    return ""


def _kernelize_model(model: torch.nn.Module, kernel: Any, repo_id: str, info: dict[str, Any], *, validate: bool,
                     tolerance: dict, state: Any, report: KernelizeReport) -> None:
    for i, (path, module) in enumerate(attention_modules(model)):
        reason = _static_reason(module)
        if reason:
            report.kept.append(Kept(path, LAYER_KIND, reason))
            continue
        original = module.processor
        route = AttentionRoute(original, kernel.flash_attention)
        state.routes[path] = route
        module.set_processor(route)
        probe = _validate(module, route, seed=i)
        tol = tolerance.get(dtype_device(module)[0], 1e-4)
        reason = _keep_reason(route, probe, validate, tol)
        if reason:
            module.set_processor(original)
            del state.routes[path]
            report.kept.append(Kept(path, LAYER_KIND, reason))
            continue
        report.replaced.append(Replaced(
            layer=path, kind=LAYER_KIND, repo_id=repo_id, version=info["version"], commit=info["commit"],
            variant=info["variant"], implementation=info["implementation"], route="processor",
            layout=_layout(module, route, probe), max_error=max(probe.errors) if validate else None,
            tolerance=tol if validate else None))


def kernelize_attention_processors(run: KindRun) -> None:
    """The attention kind on one Diffusers denoiser (its `diffusers` apply): route every attention processor whose
    sdpa calls the kernel matches; `run.state` is the denoiser's DiffusersState."""
    if not attention_modules(run.model):
        run.report.notes.append(f"{type(run.model).__name__}: no Diffusers attention module found")
        return
    loaded = kernel_for(run, runs_the_model=False)
    if loaded is None:
        return
    kernel, repo_id = loaded
    info = kernel_info(kernel, run.device, "flash_attention")
    _kernelize_model(run.model, kernel, repo_id, info, validate=run.validate, tolerance=TOLERANCE,
                     state=run.state, report=run.report)
    if run.state.routes:
        run.report.notes.append("attention processors wrapped (Diffusers processor API): each runs its own processor "
                                "with its scaled_dot_product_attention calls on the kernel; calls it cannot express "
                                "(masks other than key padding, dropout, ...) run torch's")
        if run.mode == "training":
            run.report.notes.append("attention validated on the forward pass (its backward is the kernel's autograd)")


def restore_attention_processors(model: torch.nn.Module, state: DiffusersState) -> None:
    """The attention kind's restore on a Diffusers denoiser: each original processor object back."""
    for path, route in state.routes.items():
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        if module.processor is route:  # a processor the user set since is left alone
            module.set_processor(route.original)
    state.routes.clear()
