"""The plan job: kernelize's decisions, each a function that returns its answer with the reason.

Why one module: what kernelize decides (which kernel a kind gets on this backend, whether a layer's numbers can be
checked here, whether a checked layer passes, whether its expert weights are packed, which form of the RMSNorm kernel
matches, whether a model may switch its attention implementation at all) is kept apart from the code that finds,
checks and swaps layers, so each decision is testable on plain values and every report row can say why. The facts
come in as arguments (errors, tolerances, device types, the kernel's own answers); only `kernel_specs` reads the
registry and `backend_of` reads where a model's parameters live. Like the other decisions of kernel-hub (versions,
variants) it imports no framework at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..contract import PACKED_EXPERTS_ENTRIES, experts_function_problems
from ..errors import KernelHubError
from ..names import check_repo_id
from ..numerics import relative_error
from ..registry import load_registry
from .kinds import kind_convention, kind_names
from .swap import packed_placeholders

MODES = ("inference", "training")
#: Set to "0" to keep every expert block unpacked (packing.py reads it).
PACK_ENV = "KERNEL_HUB_CPU_PACK"
#: Keys of a mapping value that names a repo ({"repo_id": ..., "version": ..., "revision": ...}).
REPO_KEYS = frozenset({"repo_id", "version", "revision"})
#: The version a repo outside registry.yaml gets when the mapping names none: its newest release tag.
NEWEST_RELEASE = ">=0"


# --- which kernel, on which backend ---------------------------------------------------------------------------------


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise KernelHubError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def backend_of(model: Any, device: Any) -> tuple[str, Any]:
    """(backend name, torch device) kernelize plans for: `device` when given, else where the model's parameters are
    (packed expert weights' meta placeholders do not count: their bytes live on the CPU)."""
    import torch  # the decisions below import no framework; this reads torch's devices

    if device is None:
        stand_ins = packed_placeholders(model) if hasattr(model, "modules") else set()
        param = next((p for p in model.parameters() if id(p) not in stand_ins), None)
        dev = param.device if param is not None else torch.device("cpu")
    else:
        try:
            dev = torch.device(device)
        except RuntimeError:  # "tpu" where torch_tpu has no TPU to register the device type for
            if str(device).split(":")[0].lower() != "tpu":
                raise KernelHubError(f"device {device!r} is not a device torch knows here") from None
            return "tpu", "tpu"
    return backend_for(dev.type, hip=bool(getattr(torch.version, "hip", None))), dev


def backend_for(device_type: str, *, hip: bool = False) -> str:
    """The kernel backend for a torch device type."""
    if device_type == "cuda":
        return "rocm" if hip else "cuda"
    if device_type in ("cpu", "meta"):
        return "cpu"
    return "tpu"


@dataclass(frozen=True)
class RepoSpec:
    """A mapping value naming a repo: what get_kernel is asked for, with kernelize's trust setting."""

    repo_id: str
    version: int | str | None = None
    revision: str | None = None
    trust_remote_code: Any = False

    def __str__(self) -> str:
        return self.repo_id


def repo_spec(value: str | dict[str, Any], kind: str, trust_remote_code: Any = False) -> RepoSpec:
    """A mapping value ("org/repo" or {"repo_id", "version", "revision"}) as a RepoSpec; a repo outside
    registry.yaml with neither version nor revision gets its newest release (NEWEST_RELEASE)."""
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


def kernel_specs(mapping: dict[str, Any] | None, backend: str, trust_remote_code: Any = False) -> dict[str, Any]:
    """kind -> repo id / RepoSpec / loaded kernel module / None, from the registry overridden by `mapping`; raises
    on a bad mapping (before kernelize changes anything)."""
    kinds = kind_names()
    registry = load_registry()
    specs: dict[str, Any] = {k: registry.repo_for_layer(k, backend) for k in kinds}
    for kind, value in (mapping or {}).items():
        if kind not in kinds:
            raise KernelHubError(f"unknown layer kind {kind!r} in mapping; kernelize knows: {', '.join(kinds)}")
        if isinstance(value, dict) and not (REPO_KEYS & set(value)):
            value = value.get(backend)  # {backend: repo id}
        if isinstance(value, str | dict):
            value = repo_spec(value, kind, trust_remote_code)
        elif value is not None and kind_convention(kind, value)[0] is None:
            raise KernelHubError(
                f"mapping[{kind!r}] must be a repo id, {{'repo_id', 'version', 'revision'}}, a {{backend: repo id}} "
                f"dict, a loaded kernel or None; got {type(value).__name__} "
                f"({kind_convention(kind, value)[1]})"
            )
        specs[kind] = value
    return specs


# --- moe_experts: which convention a kernel serves it through -------------------------------------------------------

#: The conventions a moe_experts kernel may keep, in the order kernelize prefers them: ours (contract.py ExpertsKernel:
#: `moe_experts`, or a bare `ragged_dot` kernelize builds the block on), then transformers' experts functions.
EXPERTS_CONVENTIONS = ("moe_experts", "ragged_dot", "experts_forward")


def experts_convention(kernel: Any) -> tuple[str | None, str]:
    """(the convention kernelize runs `kernel` through for moe_experts, why), or (None, why none): ours where the
    kernel keeps it (it also carries packing and quantized weights), else transformers' `experts_forward(self,
    hidden_states, top_k_index, top_k_weights)` when it can be called that way."""
    for name in EXPERTS_CONVENTIONS[:2]:
        if callable(getattr(kernel, name, None)):
            return name, f"exports {name} (kernel-hub's moe_experts contract)"
    fn = getattr(kernel, "experts_forward", None)
    if fn is None:
        return None, f"exports none of {', '.join(EXPERTS_CONVENTIONS)}"
    problems = experts_function_problems(fn)
    if problems:
        return None, f"its experts_forward is not transformers' experts function: {'; '.join(problems)}"
    return "experts_forward", "exports experts_forward (transformers' experts-function convention)"


# --- whether a layer's numbers can be checked, and whether they pass ------------------------------------------------


def not_validated_reason(backend: str, tensors_on: str) -> str | None:
    """Why a layer's numbers cannot be checked here (None: they can): kernelizing for a TPU validates the kernel's
    TPU path, and that runs only on tensors already on a TPU (elsewhere the build runs its path for their device)."""
    if backend == "tpu" and tensors_on != "tpu":
        return (f"not validated: needs a TPU (the layers' weights are on {tensors_on}, and the torch-tpu build runs "
                "its Pallas kernels only on TPU tensors; move the model to the TPU and kernelize there to check them)")
    return None


def verdict(error: float | None, tolerance: float) -> str:
    """Why a checked layer keeps its implementation ("" if the kernel may replace it); NaN never passes."""
    if error is not None and error <= tolerance:
        return ""
    if error is None:
        return "validation failed: no error was measured"
    return f"validation failed: max error {error:.2e} > tolerance {tolerance:.0e}"


def switch_check(before: list[Any], after: list[Any], tol: float, previous: str | None) -> str:
    """Why a transformers model may not switch to "kernel_hub" attention ("" if it may). `after` is the model
    switched, every layer returning its previous implementation's output: anything but `before` means the model
    computes differently under another implementation name, beyond the attention function kernelize swaps."""
    errors = [relative_error(a, b) for a, b in zip(after, before, strict=True) if a is not None and b is not None]
    err = max(errors, default=0.0)
    if err <= tol:
        return ""
    return (f"the model computes differently once its attention implementation is not {previous!r} (output error "
            f"{err:.2e} > {tol:.0e} with every layer on its previous implementation)")


# --- rms_norm: which form of the kernel -----------------------------------------------------------------------------

#: (zero_centered, scale_after_cast) in the order ties are broken: f32 results cannot tell the cast orders apart.
FORMS = ((False, True), (False, False), (True, False), (True, True))


def form_name(zero_centered: bool, scale_after_cast: bool) -> str:
    scale = "(1 + weight)" if zero_centered else "weight"
    return f"{scale} * x_normed, {'cast before scaling' if scale_after_cast else 'scaled in f32'}"


def choose_form(errors: list[float], tolerance: float) -> tuple[int | None, str]:
    """(index into FORMS of the closest form within tolerance or None, the reason)."""
    best = min(range(len(errors)), key=lambda i: (errors[i], i))
    summary = ", ".join(f"{form_name(*FORMS[i])}: {errors[i]:.1e}" for i in range(len(errors)))
    if errors[best] <= tolerance:
        return best, f"form matched on the layer's own outputs ({form_name(*FORMS[best])}: {errors[best]:.1e})"
    return None, f"validation failed: no form of the kernel matches this layer within {tolerance:.0e} ({summary})"


# --- moe_experts: packed CPU weights --------------------------------------------------------------------------------


def decide_packing(
    *, mode: str, device_type: str, dtype: str, requires_grad: bool, kernel_exports: bool,
    support: tuple[bool, str] | None, enabled: bool,
) -> tuple[bool, str]:
    """(pack this block's expert weights, why). Every fact about the system comes in as an argument.

    support: the kernel's packing_support(dtype) answer (None when the kernel cannot be asked)."""
    if not enabled:
        return False, f"not packed: disabled by {PACK_ENV}=0"
    if mode != "inference":
        return False, f"not packed: mode={mode!r} (packed weights are inference-only)"
    if requires_grad:
        return False, ("not packed: expert weights require grad (packed weights are inference-only; "
                       "model.requires_grad_(False) before kernelize packs them)")
    if device_type != "cpu":
        return False, f"not packed: weights on {device_type} (packing is for CPU)"
    if not kernel_exports or support is None:
        return False, ("not packed: the kernel exports no packed-weights entry ("
                       + ", ".join(PACKED_EXPERTS_ENTRIES) + ")")
    ok, why = support
    if not ok:
        return False, f"not packed: {why}"
    return True, f"{dtype}, inference, frozen weights; {why}"
