"""The moe_experts kind's flow over the jobs: find.find_experts (blocks and their layouts) -> load (the kernel) -> per
block validate.validate_layer against the block's own implementation, plan.verdict -> swap: the transformers adapter's
hooks (transformers.py) and one `model.set_experts_implementation("kernel_hub")`, an instance forward where a block does
not route through ExpertsInterface -> quantized copies (quantize.py) or packing (packing.py) where
plan.decide_packing allows -> report rows; restore unpacks and unhooks each block and puts every config's
implementation back.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from ...find import device_type
from ...layer_check import tolerance_for
from ...load import kernel_info, load_or_reason
from ...plan import not_validated_reason, verdict
from ...report import Kept, KernelizeReport, Replaced
from ...swap import KernelizeState, put_back_names
from ...weights_guard import KernelRefused, guarded_call
from ..declaration import KindRun
from . import packing, quantize
from . import transformers as hf_experts
from .contract import NAME, PACKED_EXPERTS_ENTRIES
from .find import ExpertsSite, find_experts, routes_through_interface, top_k_of
from .plan import decide_packing, experts_convention
from .validate import experts_batch, validate_layer


@dataclass
class ExpertsState:
    """What restore needs of this kind (KernelizeState.kinds[NAME]): the hooked blocks' paths and each config's
    experts implementation before the switch, the model's own choice too."""

    paths: list[str] = field(default_factory=list)
    previous: dict[str, str | None] | str | None = None  # get_experts_implementation(): per submodule or one
    configs: list[tuple[Any, str | None]] = field(default_factory=list)
    switched: bool = False


@dataclass(frozen=True)
class AcceptedBlock:
    """A block that passed validation, held until every hook is installed: then quantized or packed."""

    seed: int  # its index among the found blocks: the seed of its validation batch
    module: torch.nn.Module
    site: ExpertsSite
    call: hf_experts.ExpertsCall
    error: float | None
    tolerance: float
    not_validated: str | None

    def check(self, mode: str, top_k: int) -> float:
        """The block's error against its own implementation (quantize.py re-checks a quantized copy with it)."""
        reference = hf_experts.reference_for(self.module, self.site)
        return validate_layer(self.module, self.site.layout, self.call, reference, mode=mode, top_k=top_k,
                              seed=self.seed)


def apply(run: KindRun) -> None:
    sites = find_experts(run.model)
    if not sites:
        run.report.notes.append("no Mixture-of-Experts expert layers found")
        return
    kernel, repo_id, reason = load_or_reason(run.spec, run.kind, run.backend)
    if kernel is None:
        run.report.kept += [Kept(s.path, NAME, s.reason if not s.supported else reason) for s in sites]
        return
    _swap(run, sites, kernel, repo_id)


def _check(run: KindRun, i: int, module: torch.nn.Module, site: ExpertsSite, call: hf_experts.ExpertsCall,
           config: Any, reference: Any) -> tuple[float | None, float, str | None, str]:
    """(error, tolerance, why not validated, why kept) for one supported block, against `reference`."""
    err, tol = None, tolerance_for(getattr(torch, site.layout.dtype))
    unchecked = not_validated_reason(run.backend, device_type(module)) if run.validate else None
    if not run.validate or unchecked is not None:
        return err, tol, unchecked, ""
    try:
        err = validate_layer(module, site.layout, call, reference, mode=run.mode,
                             top_k=top_k_of(getattr(module, "config", config), site.layout.num_experts), seed=i)
    except KernelRefused as exc:  # wrote to the block's weights (put back), or returned another dtype / shape
        return err, tol, unchecked, str(exc)
    except Exception as exc:
        return err, tol, unchecked, f"kernel raised in validation: {type(exc).__name__}: {exc}"
    return err, tol, unchecked, verdict(err, tol)


def _swap(run: KindRun, sites: list[ExpertsSite], kernel: Any, repo_id: str) -> None:
    model, state, report = run.model, run.state, run.report
    convention, _ = experts_convention(kernel)  # load_or_reason has checked there is one
    assert convention is not None
    info = kernel_info(kernel, run.device, "ragged_dot" if convention != "experts_forward" else convention)
    config = getattr(model, "config", None)
    hooks: list[tuple[Any, ExpertsSite, hf_experts.ExpertsHook]] = []
    accepted: list[AcceptedBlock] = []
    for i, site in enumerate(sites):
        module = model.get_submodule(site.path)
        interface = site.route == "interface" or routes_through_interface(module)
        previous = module.config._experts_implementation if interface else None
        call = None
        unfit = hf_experts.experts_function_fits(module, site) if convention == "experts_forward" else ""
        if not site.supported or unfit:
            report.kept.append(Kept(site.path, NAME, site.reason if not site.supported else unfit))
        else:
            call = guarded_call(hf_experts.make_call(kernel, site.layout, convention))  # no weight writes at run time
            fp8_model = site.layout.weights == "fp8-model"  # the block's own float8 weights (quantize.py)
            if fp8_model:
                quantize.install(module, quantize.fp8_model_record(module, site.layout))
            reference = (quantize.fp8_reference(module, site.layout) if fp8_model
                         else hf_experts.reference_for(module, site))
            err, tol, unchecked, why = _check(run, i, module, site, call, config, reference)
            if why:
                call = None
                report.kept.append(Kept(site.path, NAME, why))
                if fp8_model:
                    quantize.drop(module)
            else:
                accepted.append(AcceptedBlock(i, module, site, call, err, tol, unchecked))
        if interface or call is not None:
            hooks.append((module, site, hf_experts.ExpertsHook(call=call, previous=previous,
                                                        route="interface" if interface else "forward")))
    if not any(h.call is not None for _, _, h in hooks):
        return  # nothing to swap: leave the model exactly as it was
    _install(model, hooks, state.kinds.setdefault(NAME, ExpertsState()), report)
    # after the hooks: restore() now sees every packed block
    for block in accepted:
        module, site, err, tol, unchecked = block.module, block.site, block.error, block.tolerance, block.not_validated
        top_k = top_k_of(getattr(module, "config", config), site.layout.num_experts)
        outcome = quantize.apply_to_block(
            module, site.layout, run.quantize, kernel, tolerance=tol, validate=run.validate and unchecked is None,
            check=functools.partial(block.check, run.mode, top_k))
        if outcome is not None and outcome.quantized is not None:
            packed, why = False, f"quantized experts: {outcome.why}"
            if outcome.max_error is not None:
                err, tol = outcome.max_error, outcome.bound
        else:
            packed, why = _pack(run, module, site, block.call, kernel, top_k, seed=block.seed, convention=convention)
            why = why if outcome is None else f"{outcome.why}; {why}"
        implementation = info["implementation"]
        report.replaced.append(Replaced(
            layer=site.path, kind=NAME, repo_id=repo_id, version=info["version"], commit=info["commit"],
            variant=info["variant"],
            implementation=f"packed experts on {implementation}" if packed else implementation,
            route=site.route, layout=site.layout.describe(), max_error=err,
            tolerance=tol if run.validate and unchecked is None else None, not_validated=unchecked, why=why,
            quantized=None if outcome is None else outcome.quantized,
            bytes_before=None if outcome is None else outcome.bytes_before,
            bytes_after=None if outcome is None else outcome.bytes_after, convention=convention))


def _install(model: torch.nn.Module, hooks: list[tuple[Any, ExpertsSite, hf_experts.ExpertsHook]], state: ExpertsState,
             report: KernelizeReport) -> None:
    """Hook every block (recorded in `state` first), switch the model's experts implementation once; blocks the
    switch did not reach get an instance forward."""
    hf_experts.register_implementation()
    seen: set[int] = set()
    for module, _, hook in hooks:
        if hook.route == "interface" and id(module.config) not in seen:
            seen.add(id(module.config))
            state.configs.append((module.config, module.config._experts_implementation))
    for module, site, hook in hooks:
        state.paths.append(site.path)
        if hook.route == "interface":
            module.__dict__[hf_experts.HOOK_ATTR] = hook
        else:
            hf_experts.install_forward(module, hook)
    if not state.configs:
        return
    if hasattr(model, "set_experts_implementation"):
        state.previous = model.get_experts_implementation()
        state.switched = True
        model.set_experts_implementation(hf_experts.IMPLEMENTATION_NAME)
        hf_experts.honour_user_switch(model)  # a later set_experts_implementation(...) by the user wins
    for module, _, hook in hooks:
        if hook.route == "interface" and module.config._experts_implementation != hf_experts.IMPLEMENTATION_NAME:
            hook.route = "forward"
            module.__dict__.pop(hf_experts.HOOK_ATTR, None)
            hf_experts.install_forward(module, hook)
    report.notes.append(f"experts implementation switched to {hf_experts.IMPLEMENTATION_NAME!r} "
                        f"(was {state.previous}); kept layers run their previous implementation")


def _pack(run: KindRun, module: torch.nn.Module, site: ExpertsSite, call: hf_experts.ExpertsCall, kernel: Any,
          top_k: int, seed: int, convention: str) -> tuple[bool, str]:
    """Pack one replaced block's expert weights where plan.decide_packing allows; with validation on, the packed
    path must equal the unpacked one bit for bit on the validation batch, or the block is unpacked again. A kernel
    run through transformers' experts functions reads the block's dense weights: never packed."""
    layout, dev = site.layout, run.device
    exports = convention != "experts_forward" and all(hasattr(kernel, name) for name in PACKED_EXPERTS_ENTRIES)
    dtype = getattr(torch, layout.dtype)
    ok, why = decide_packing(
        mode=run.mode, device_type=getattr(dev, "type", str(dev)), dtype=layout.dtype,
        requires_grad=any(p.requires_grad for p in module.parameters(recurse=False)),
        kernel_exports=exports, support=kernel.packing_support(dtype) if exports else None,
        enabled=packing.packing_enabled())
    if not ok:
        return False, why
    batch = experts_batch(layout, top_k, dtype, dev, seed) if run.validate else None
    if batch is not None:
        with torch.no_grad():
            reference = call(module, *batch)
    packed, how = packing.pack_module(module, layout, kernel)
    if not packed:
        return False, how
    if batch is not None:
        with torch.no_grad():
            out = call(module, *batch)
        if not torch.equal(out, reference):
            packing.unpack_module(module)
            return False, "not packed: the packed path differed from the unpacked one on the validation batch"
    return True, f"{how}: {why}" + ("; bit-identical to the unpacked path on the validation batch"
                                    if run.validate else "")


def restore(model: torch.nn.Module, kernelized: KernelizeState) -> None:
    """Unpack and unhook each block, put back every config's experts implementation."""
    hf_experts.drop_user_switch(model)
    state: ExpertsState | None = kernelized.kinds.get(NAME)
    if state is None:
        return
    for path in state.paths:
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        packing.unpack_module(module)
        quantize.drop(module)  # quantized copies (quantize.py)
        hf_experts.remove_hook(module)
    if state.switched and state.previous is not None and hasattr(model, "set_experts_implementation"):
        with contextlib.suppress(Exception):  # the exact per-config restore below still runs
            model.set_experts_implementation(state.previous)
    put_back_names(state.configs, "_experts_implementation")

