"""kernelize(model) / restore(model): swap a transformers model's expert layers onto a hub kernel.

Flow: find expert blocks (families.py) -> which kernel serves them on this backend (registry.yaml
`layers`, or `mapping=`) -> load its torch-facing build -> per block: run the previous implementation
and the kernel on a random batch of the block's own shapes, keep the previous one if they disagree ->
hook the block (experts.py) -> one `model.set_experts_implementation("kernel_hub")`. Any exception on
the way restores the model before it propagates, so a model is never left half patched.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import KernelHubError
from ..numerics import TOLERANCE as TOLERANCES_BY_NAME
from ..numerics import relative_error
from . import attention as at
from . import experts as ex
from . import packing
from . import quantize as qz
from .attention_api import AttentionState, can_switch, kernelize_attention
from .families import LAYER_KIND, ExpertsLayout, ExpertsSite, find_experts, routes_through_interface, top_k_of
from .kinds import KindRun, all_kinds, kind_exports, kind_names
from .own_config import OwnConfigs, give_back_configs, take_own_configs
from .report import Kept, KernelizeReport, Replaced
from .sharded import local_parameters

#: Every layer kind, declared once in layers/kinds/ (one module each).
SUPPORTED_KINDS = kind_names()
#: The function a loaded kernel must export to serve each layer kind.
KIND_EXPORTS = kind_exports()
MODES = ("inference", "training")
STATE_ATTR = "_kernel_hub_state"
#: Relative error (numerics.relative_error of kernel vs default) allowed per dtype: numerics.TOLERANCE, by torch dtype.
TOLERANCE = {getattr(torch, name): tol for name, tol in TOLERANCES_BY_NAME.items()}
VALIDATION_TOKENS = 16


@dataclass
class _State:
    """What restore needs: hooked module paths and every config's implementation before the switch."""

    paths: list[str] = field(default_factory=list)
    previous: dict[str, str | None] | None = None
    configs: list[tuple[Any, str | None]] = field(default_factory=list)
    switched: bool = False
    attention: AttentionState = field(default_factory=AttentionState)
    own_configs: OwnConfigs = field(default_factory=OwnConfigs)  # the model's private config copies (own_config.py)
    kinds: dict[str, Any] = field(default_factory=dict)  # state of the other declared kinds (layers/kinds/), by name
    quantize: str | None = None  # kernelize's quantize= (layers/quantize.py)


def _backend_of(model: Any, device: Any) -> tuple[str, torch.device | str]:
    if device is None:  # packed expert weights (meta placeholders) live on the CPU
        stand_ins = packing.placeholders(model) if hasattr(model, "modules") else set()
        param = next((p for p in model.parameters() if id(p) not in stand_ins), None)
        dev = param.device if param is not None else torch.device("cpu")
    else:
        try:
            dev = torch.device(device)
        except RuntimeError:  # "tpu" where torch_tpu has no TPU to register the device type for
            if str(device).split(":")[0].lower() != "tpu":
                raise KernelHubError(f"device {device!r} is not a device torch knows here") from None
            return "tpu", "tpu"
    kind = dev.type
    if kind == "cuda":
        return ("rocm" if getattr(torch.version, "hip", None) else "cuda"), dev
    if kind in ("cpu", "meta"):
        return "cpu", dev
    return "tpu", dev


def not_validated_reason(backend: str, tensors_on: str) -> str | None:
    """Why a layer's numbers cannot be checked here (None: they can): kernelizing for a TPU validates the kernel's
    TPU path, and that runs only on tensors already on a TPU (elsewhere the build runs its path for their device)."""
    if backend == "tpu" and tensors_on != "tpu":
        return (f"not validated: needs a TPU (the layers' weights are on {tensors_on}, and the torch-tpu build runs "
                "its Pallas kernels only on TPU tensors; move the model to the TPU and kernelize there to check them)")
    return None


@dataclass(frozen=True)
class RepoSpec:
    """A mapping value naming a repo: what get_kernel is asked for, with kernelize's trust setting."""

    repo_id: str
    version: int | str | None = None
    revision: str | None = None
    trust_remote_code: Any = False

    def __str__(self) -> str:
        return self.repo_id


#: Keys of a mapping value that names a repo ({"repo_id": ..., "version": ..., "revision": ...}).
REPO_KEYS = frozenset({"repo_id", "version", "revision"})
#: The version a repo outside registry.yaml gets when the mapping names none: its newest release tag.
NEWEST_RELEASE = ">=0"


def repo_spec(value: str | dict[str, Any], kind: str, trust_remote_code: Any = False) -> RepoSpec:
    """A mapping value ("org/repo" or {"repo_id", "version", "revision"}) as a RepoSpec; a repo outside
    registry.yaml with neither version nor revision gets its newest release (NEWEST_RELEASE)."""
    from ..names import check_repo_id
    from ..registry import load_registry

    fields = {"repo_id": value} if isinstance(value, str) else dict(value)
    unknown = set(fields) - REPO_KEYS
    if unknown or "repo_id" not in fields:
        raise KernelHubError(f"mapping[{kind!r}]: a repo is named by 'repo_id' (with optional 'version', "
                             f"'revision'); got keys {', '.join(sorted(map(str, fields)))}")
    repo_id = check_repo_id(fields["repo_id"], f"mapping[{kind!r}] repo id")
    version, revision = fields.get("version"), fields.get("revision")
    entry = load_registry().get(repo_id)
    if version is None and revision is None and (entry is None or not entry.version):
        version = NEWEST_RELEASE
    return RepoSpec(repo_id, version, revision, trust_remote_code)


def _kernel_spec(mapping: dict[str, Any] | None, backend: str, trust_remote_code: Any = False) -> dict[str, Any]:
    """kind -> repo id / RepoSpec / loaded kernel module / None, from the registry overridden by `mapping`."""
    from ..registry import load_registry

    registry = load_registry()
    specs: dict[str, Any] = {k: registry.repo_for_layer(k, backend) for k in SUPPORTED_KINDS}
    for kind, value in (mapping or {}).items():
        if kind not in SUPPORTED_KINDS:
            raise KernelHubError(
                f"unknown layer kind {kind!r} in mapping; kernelize knows: {', '.join(SUPPORTED_KINDS)}"
            )
        if isinstance(value, dict) and not (REPO_KEYS & set(value)):
            value = value.get(backend)  # {backend: repo id}
        if isinstance(value, str | dict):
            value = repo_spec(value, kind, trust_remote_code)
        elif value is not None and not hasattr(value, KIND_EXPORTS[kind]):
            raise KernelHubError(
                f"mapping[{kind!r}] must be a repo id, {{'repo_id', 'version', 'revision'}}, a {{backend: repo id}} "
                f"dict, a loaded kernel or None; got {type(value).__name__}"
            )
        specs[kind] = value
    return specs


def _load(spec: Any, backend: str) -> tuple[Any, str]:
    """(kernel module, repo id) for a mapping value."""
    from ..api import get_kernel

    if isinstance(spec, RepoSpec):
        return get_kernel(spec.repo_id, version=spec.version, revision=spec.revision, framework="torch",
                          backend=backend, trust_remote_code=spec.trust_remote_code), spec.repo_id
    if not isinstance(spec, str):
        info = getattr(spec, "__kernel_hub__", None)
        return spec, getattr(info, "repo_id", None) or getattr(spec, "__name__", type(spec).__name__)
    return get_kernel(spec, framework="torch", backend=backend), spec


def _rel_error(out: torch.Tensor | None, ref: torch.Tensor | None) -> float:
    """numerics.relative_error, where a gradient may be None on both sides (0) or one (inf)."""
    if out is None and ref is None:
        return 0.0
    if out is None or ref is None:
        return math.inf
    return relative_error(out, ref)


def _validation_batch(layout: ExpertsLayout, top_k: int, dtype: torch.dtype, device: torch.device, seed: int):
    g = torch.Generator().manual_seed(seed)  # private generator: the user's RNG stream is untouched
    t, e = VALIDATION_TOKENS, layout.num_experts
    hidden = torch.randn(t, layout.hidden_size, generator=g).to(device, dtype)
    index = torch.argsort(torch.rand(t, e, generator=g), dim=1)[:, :top_k].to(device)
    weights = torch.softmax(torch.randn(t, top_k, generator=g), dim=-1).to(device, dtype)
    return hidden, index, weights


def validate_layer(
    module: Any, layout: ExpertsLayout, call: ex.ExpertsCall, reference: Any, *, mode: str, top_k: int,
    seed: int = 0,
) -> float:
    """Largest relative error of the kernel against `reference` on a random batch of this block's shapes
    (training: the output and the gradients of hidden states, routing weights and expert weights)."""
    with local_parameters(module):  # a sharded block is checked on this rank's slices, as it runs
        return _validate_local(module, layout, call, reference, mode=mode, top_k=top_k, seed=seed)


def _validate_local(module: Any, layout: ExpertsLayout, call: ex.ExpertsCall, reference: Any, *, mode: str,
                    top_k: int, seed: int) -> float:
    weight = module.gate_up_proj if layout.has_gate else module.up_proj
    hidden, index, weights = _validation_batch(layout, top_k, getattr(torch, layout.dtype), weight.device, seed)
    if mode == "inference":
        with torch.no_grad():
            ref = reference(module, hidden, index, weights)
            out = call(module, hidden, index, weights)
        return _rel_error(out, ref)
    params = [p for p in module.parameters(recurse=False) if p.requires_grad]
    errors = []
    g = torch.Generator().manual_seed(seed + 1)
    cotangent = None
    grads = []
    for fn in (reference, call):
        h = hidden.clone().requires_grad_(True)
        w = weights.clone().requires_grad_(True)
        with torch.enable_grad():
            y = fn(module, h, index, w)
            if cotangent is None:
                cotangent = torch.randn(y.shape, generator=g).to(y.device, y.dtype)
            inputs = [h, w, *params]
            grads.append((y, torch.autograd.grad((y * cotangent).sum(), inputs, allow_unused=True)))
    (ref, ref_grads), (out, out_grads) = grads
    errors.append(_rel_error(out, ref))
    errors += [_rel_error(a, b) for a, b in zip(out_grads, ref_grads, strict=True)]
    return max(errors)


def kernel_info(kernel: Any, device: torch.device, default: str) -> dict[str, Any]:
    """version / commit / variant / implementation of a loaded kernel, for its report rows."""
    hub = getattr(kernel, "__kernel_hub__", None)
    return {"version": getattr(hub, "version", None) or getattr(kernel, "__version__", None),
            "commit": getattr(hub, "commit", None) or str(getattr(hub, "path", "") or "") or None,
            "variant": getattr(hub, "variant", None),
            "implementation": _describe_impl(kernel, device, default)}


def _describe_impl(kernel: Any, device: torch.device, default: str = "ragged_dot") -> str:
    for name in ("describe", "implementation_for"):
        fn = getattr(kernel, name, None)
        if callable(fn):
            try:
                return str(fn(device))
            except Exception:  # a kernel's self-description must never break kernelize
                continue
    return default


def _reference_for(module: Any, site: ExpertsSite) -> Any:
    """What the block runs now, as fn(module, hidden, index, weights)."""
    if site.route == "interface":
        return ex.previous_forward(module, module.config._experts_implementation)
    instance = module.__dict__.get("forward")
    if instance is not None:
        return lambda _m, h, i, w: instance(h, i, w)
    return ex.previous_forward(module, None)


def is_kernelized(model: Any) -> bool:
    return STATE_ATTR in getattr(model, "__dict__", {})


def kernelize(
    model: Any,
    *,
    mode: str = "inference",
    device: Any = None,
    mapping: dict[str, Any] | None = None,
    validate: bool = True,
    trust_remote_code: Any = False,
    quantize: str | None = None,
) -> KernelizeReport:
    """Run `model`'s expert and attention layers on the hub kernels the registry (or `mapping`) names for
    this backend (attention: through transformers' AttentionInterface; `mapping={"attention": None}` skips it).

    mode: "inference", or "training" (validation also compares gradients). device: the device the
    model runs on (default: where its parameters are) picks the backend. mapping: {layer kind: repo
    id | {backend: repo id} | loaded kernel | None} overrides registry.yaml's `layers`. validate: check
    each layer against its current implementation first and keep that one where they disagree.
    `restore(model)` undoes everything. A repo is also {"repo_id", "version", "revision"}; one outside
    registry.yaml with neither gets its newest release. trust_remote_code: get_kernel's rule, for the repos
    `mapping` names. quantize: "int8" (per-channel) or "fp8" (128x128 blocks): inference only; the expert weights are
    read as quantized copies kept with each block, each checked against the block's own layer within the bound
    layers/quantize.py derives (error_bound); the model's parameters are untouched (layers/quantize.py).
    """
    if mode not in MODES:
        raise KernelHubError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    quantize = qz.check_quantize(quantize, mode)
    from .diffusers import is_diffusers_object, kernelize_diffusers

    if is_diffusers_object(model):  # Diffusers models and pipelines: the same kinds, attention via the processor API
        return kernelize_diffusers(model, mode=mode, device=device, mapping=mapping, validate=validate,
                                   trust_remote_code=trust_remote_code)
    if not hasattr(model, "named_modules"):
        raise KernelHubError(f"kernelize wants a torch.nn.Module, got {type(model).__name__}")
    backend, dev = _backend_of(model, device)
    specs = _kernel_spec(mapping, backend, trust_remote_code)  # raises on bad mapping before anything changes
    if is_kernelized(model):
        restore(model)
    report = KernelizeReport(model=type(model).__name__, mode=mode, backend=backend)
    state = _State(own_configs=take_own_configs(model), quantize=quantize)  # names switch on the model's own copies
    model.__dict__[STATE_ATTR] = state
    try:
        for kind in all_kinds():
            kind.apply(KindRun(model, specs[kind.name], backend, dev, mode, validate, state, report))
    except BaseException:
        restore(model)
        raise
    if not state.paths and not state.attention.paths and not state.kinds:
        model.__dict__.pop(STATE_ATTR, None)
        give_back_configs(state.own_configs)
    return report


def _load_or_reason(spec: Any, kind: str, backend: str) -> tuple[Any, str, str]:
    """(kernel, repo id, "") or (None, "", why not) for a mapping value."""
    if spec is None:
        return None, "", f"no kernel mapped to {kind} on {backend} (registry.yaml layers / mapping=)"
    try:
        kernel, repo_id = _load(spec, backend)
    except Exception as exc:  # a kernel that fails to load leaves the model as it is
        lines = str(exc).splitlines() or [""]
        # a variant trace: its first line, and the line of the build kernelize wanted (torch-<backend>)
        wanted = [ln.strip() for ln in lines[1:] if ln.split()[1:2] == [f"torch-{backend}"]]
        return None, "", f"{spec} did not load: {type(exc).__name__}: {' '.join(lines[:1] + wanted[:1])}"
    if not hasattr(kernel, KIND_EXPORTS[kind]):
        return None, "", f"{repo_id} does not export {KIND_EXPORTS[kind]} for {kind}"
    return kernel, repo_id, ""


def _kernelize_experts(model, spec, backend, dev, mode, validate, state: _State, report: KernelizeReport) -> None:
    sites = find_experts(model)
    if not sites:
        report.notes.append("no Mixture-of-Experts expert layers found")
        return
    kernel, repo_id, reason = _load_or_reason(spec, LAYER_KIND, backend)
    if kernel is None:
        report.kept += [Kept(s.path, LAYER_KIND, s.reason if not s.supported else reason) for s in sites]
        return
    _apply(model, sites, kernel, repo_id, backend, dev, mode, validate, state, report)


def _kernelize_attention(model, spec, backend, dev, mode, validate, state: _State, report: KernelizeReport) -> None:
    ok, _ = can_switch(model)
    if not ok:
        return  # not a transformers attention model (e.g. a bare expert block): nothing to say
    unchecked = not_validated_reason(backend, _device_of(model))
    if unchecked is not None and spec is not None:
        # attention layers are found (and checked) by running the model, which needs it on the TPU
        report.notes.append(f"attention unchanged: {unchecked.removeprefix('not validated: ')}")
        return
    kernel, repo_id, reason = _load_or_reason(spec, at.LAYER_KIND, backend)
    if kernel is None:
        report.notes.append(f"attention unchanged: {reason}")
        return
    info = kernel_info(kernel, dev, "flash_attention")
    kernelize_attention(model, kernel, repo_id, device=dev, validate=validate, tolerance=TOLERANCE, info=info,
                        state=state.attention, report=report)
    if mode == "training" and state.attention.paths:
        report.notes.append("attention validated on the forward pass (its backward is the kernel's autograd)")


def _device_of(module: Any) -> str:
    param = next(iter(module.parameters()), None)
    return param.device.type if param is not None else "cpu"


def _apply(model, sites, kernel, repo_id, backend, dev, mode, validate, state: _State,
           report: KernelizeReport) -> None:
    info = kernel_info(kernel, dev, "ragged_dot")
    version, commit, variant, implementation = info["version"], info["commit"], info["variant"], info["implementation"]
    config = getattr(model, "config", None)
    hooks: list[tuple[Any, ExpertsSite, ex.ExpertsHook]] = []
    accepted: list[tuple[int, Any, ExpertsSite, ex.ExpertsCall, float | None, float, str | None]] = []
    for i, site in enumerate(sites):
        module = model.get_submodule(site.path)
        interface = site.route == "interface" or routes_through_interface(module)
        previous = module.config._experts_implementation if interface else None
        call = None
        if not site.supported:
            report.kept.append(Kept(site.path, LAYER_KIND, site.reason))
        else:
            call = ex.make_call(kernel, site.layout)
            err, tol = None, TOLERANCE.get(getattr(torch, site.layout.dtype), 1e-4)
            unchecked = not_validated_reason(backend, _device_of(module)) if validate else None
            fp8_model = site.layout.weights == "fp8-model"  # the block's own float8 weights (layers/quantize.py)
            if fp8_model:
                qz.install(module, qz.fp8_model_record(module, site.layout))
            reference = qz.fp8_reference(module, site.layout) if fp8_model else _reference_for(module, site)
            if validate and unchecked is None:
                try:
                    err = validate_layer(module, site.layout, call, reference, mode=mode,
                                         top_k=top_k_of(getattr(module, "config", config), site.layout.num_experts),
                                         seed=i)
                except Exception as exc:
                    call = None
                    report.kept.append(Kept(site.path, LAYER_KIND,
                                            f"kernel raised in validation: {type(exc).__name__}: {exc}"))
                else:
                    if not err <= tol:
                        call = None
                        report.kept.append(Kept(site.path, LAYER_KIND,
                                                f"validation failed: max error {err:.2e} > tolerance {tol:.0e}"))
            if call is not None:
                accepted.append((i, module, site, call, err, tol, unchecked))
            elif fp8_model:
                qz.drop(module)
        if interface or call is not None:
            hooks.append((module, site, ex.ExpertsHook(call=call, previous=previous,
                                                        route="interface" if interface else "forward")))
    if not any(h.call is not None for _, _, h in hooks):
        return  # nothing to swap: leave the model exactly as it was

    ex.register_implementation()
    seen: set[int] = set()
    for module, _, hook in hooks:
        if hook.route == "interface" and id(module.config) not in seen:
            seen.add(id(module.config))
            state.configs.append((module.config, module.config._experts_implementation))
    for module, site, hook in hooks:
        state.paths.append(site.path)
        if hook.route == "interface":
            module.__dict__[ex.HOOK_ATTR] = hook
        else:
            ex.install_forward(module, hook)
    if state.configs:
        if hasattr(model, "set_experts_implementation"):
            state.previous = model.get_experts_implementation()
            state.switched = True
            model.set_experts_implementation(ex.IMPLEMENTATION_NAME)
            ex.honour_user_switch(model)  # a later set_experts_implementation(...) by the user wins
        # Blocks the model-level switch did not reach get an instance forward instead.
        for module, _, hook in hooks:
            if hook.route == "interface" and module.config._experts_implementation != ex.IMPLEMENTATION_NAME:
                hook.route = "forward"
                module.__dict__.pop(ex.HOOK_ATTR, None)
                ex.install_forward(module, hook)
        report.notes.append(f"experts implementation switched to {ex.IMPLEMENTATION_NAME!r} "
                            f"(was {state.previous}); kept layers run their previous implementation")
    # after the hooks: restore() now sees every packed block
    for i, module, site, call, err, tol, unchecked in accepted:
        top_k = top_k_of(getattr(module, "config", config), site.layout.num_experts)
        outcome = qz.apply_to_block(
            module, site.layout, state.quantize, kernel, tolerance=tol, validate=validate and unchecked is None,
            check=lambda m=module, s=site, c=call, i=i, k=top_k: validate_layer(
                m, s.layout, c, _reference_for(m, s), mode=mode, top_k=k, seed=i))
        if outcome is not None and outcome.quantized is not None:
            packed, why = False, f"quantized experts: {outcome.why}"
            if outcome.max_error is not None:
                err, tol = outcome.max_error, outcome.bound
        else:
            packed, why = _pack_experts(module, site, call, kernel, dev, mode, validate, top_k, seed=i)
            why = why if outcome is None else f"{outcome.why}; {why}"
        report.replaced.append(Replaced(
            layer=site.path, kind=LAYER_KIND, repo_id=repo_id, version=version, commit=commit, variant=variant,
            implementation=f"packed experts on {implementation}" if packed else implementation,
            route=site.route, layout=site.layout.describe(), max_error=err,
            tolerance=tol if validate and unchecked is None else None, not_validated=unchecked, why=why,
            quantized=None if outcome is None else outcome.quantized,
            bytes_before=None if outcome is None else outcome.bytes_before,
            bytes_after=None if outcome is None else outcome.bytes_after))


def _pack_experts(module, site: ExpertsSite, call: ex.ExpertsCall, kernel, dev, mode: str, validate: bool,
                  top_k: int, seed: int) -> tuple[bool, str]:
    """Pack one replaced block's expert weights where packing.decide_packing allows; with `validate`, the packed
    path must equal the unpacked one bit for bit on the validation batch, or the block is unpacked again."""
    layout = site.layout
    exports = all(hasattr(kernel, name) for name in packing.PACKED_EXPORTS)
    dtype = getattr(torch, layout.dtype)
    ok, why = packing.decide_packing(
        mode=mode, device_type=getattr(dev, "type", str(dev)), dtype=layout.dtype,
        requires_grad=any(p.requires_grad for p in module.parameters(recurse=False)),
        kernel_exports=exports, support=kernel.packing_support(dtype) if exports else None,
        enabled=packing.packing_enabled())
    if not ok:
        return False, why
    batch = _validation_batch(layout, top_k, dtype, dev, seed) if validate else None
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
    return True, f"{how}: {why}" + ("; bit-identical to the unpacked path on the validation batch" if validate else "")


def restore(model: Any) -> bool:
    """Put back exactly what `model` ran before kernelize; False if it was not kernelized."""
    from .diffusers import is_diffusers_object, restore_diffusers

    if is_diffusers_object(model):
        return restore_diffusers(model)
    state: _State | None = model.__dict__.pop(STATE_ATTR, None)
    if state is None:
        return False
    for kind in reversed(all_kinds()):
        kind.restore(model, state)
    give_back_configs(state.own_configs)  # after every kind has put its names back on the copies
    return True


def _restore_experts(model: Any, state: _State) -> None:
    """The experts' part of restore: unpack and unhook each block, put back every config's implementation."""
    ex.drop_user_switch(model)
    for path in state.paths:
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        packing.unpack_module(module)
        qz.drop(module)  # quantized copies (layers/quantize.py)
        ex.remove_hook(module)
    if state.switched and state.previous is not None and hasattr(model, "set_experts_implementation"):
        with contextlib.suppress(Exception):  # the exact per-config restore below still runs
            model.set_experts_implementation(state.previous)
    for cfg, value in state.configs:
        if cfg._experts_implementation != value:
            cfg._experts_implementation_internal = value
