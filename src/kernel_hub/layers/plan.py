"""The plan job: kernelize's shared decisions, each a function that returns its answer with the reason.

Why one module: what kernelize decides for every kind (which kernel a kind gets on this backend, whether a layer's
numbers can be checked here, whether a checked layer passes) is kept apart from the code that finds, checks and swaps
layers, so each decision is testable on plain values and every report row can say why; a kind's own decisions live in
its folder (kinds/<kind>/plan.py). The facts come in as arguments (errors, tolerances, device types, the kinds
kernelize runs); only `kernel_specs` reads the registry and `backend_of` reads where a model's parameters live. Like
the other decisions of kernel-hub (versions, variants) it imports no framework at module level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import KernelHubError
from ..load.registry import load_registry
from ..load.trust import NOTHING_EXTRA, TrustPolicy, trust_policy
from ..names import check_repo_id
from .hf_compat import LocalSpec, check_mode_arg, normalize_mapping
from .swap import stand_in_parameters

if TYPE_CHECKING:
    from .kinds.declaration import LayerKind

MODES = ("inference", "training")
#: Keys of a mapping value that names a repo ({"repo_id": ..., "version": ..., "revision": ...}; trust_remote_code
#: for that repo alone, as HF's LayerRepository carries it).
REPO_KEYS = frozenset({"repo_id", "version", "revision", "trust_remote_code"})
#: The version a repo outside registry.yaml gets when the mapping names none: its newest release tag.
NEWEST_RELEASE = ">=0"


# --- which kernel, on which backend ---------------------------------------------------------------------------------


def check_mode(mode: Any) -> str:
    """kernelize's mode name for `mode=`: "inference" / "training", or HF `kernels.Mode` meaning one of them."""
    return check_mode_arg(mode)


def backend_of(model: Any, device: Any) -> tuple[str, Any]:
    """(backend name, torch device) kernelize plans for: `device` when given, else where the model's parameters are
    (packed expert weights' meta placeholders do not count: their bytes live on the CPU)."""
    import torch  # the decisions below import no framework; this reads torch's devices

    if device is None:
        stand_ins = stand_in_parameters(model) if hasattr(model, "modules") else set()
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
    """A mapping value naming a repo: what get_kernel is asked for, with the trust policy it loads under (the
    value's own trust_remote_code, else kernelize's)."""

    repo_id: str
    version: int | str | None = None
    revision: str | None = None
    trust: TrustPolicy = NOTHING_EXTRA

    def __str__(self) -> str:
        return self.repo_id


def repo_spec(value: str | dict[str, Any], kind: str, trust: TrustPolicy = NOTHING_EXTRA) -> RepoSpec:
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
    own = fields.get("trust_remote_code")  # a mapping value is input too: its own setting is read here, once
    return RepoSpec(repo_id, version, revision, trust_policy(own) if own else trust)


def kernel_specs(mapping: dict[str, Any] | None, backend: str, trust: TrustPolicy = NOTHING_EXTRA, *,
                 kinds: Sequence[LayerKind], mode: str = "inference") -> dict[str, Any]:
    """kind -> repo id / RepoSpec / LocalSpec / loaded kernel module / None for each of `kinds`, from the registry
    overridden by `mapping` (HF `kernels` keys and values read as ours: hf_compat); raises on a bad mapping (before
    kernelize changes anything)."""
    declared = {k.name: k for k in kinds}
    names = tuple(declared)
    registry = load_registry()
    specs: dict[str, Any] = {k: registry.repo_for_layer(k, backend) for k in names}
    translated, _ = normalize_mapping(mapping, kinds, backend, mode)
    for kind, value in translated.items():
        if isinstance(value, str | dict):
            value = repo_spec(value, kind, trust)
        elif isinstance(value, LocalSpec):
            if not (value.path / "kernel.yaml").is_file():
                raise KernelHubError(f"mapping[{kind!r}]: {value.path} holds no kernel.yaml; kernelize loads a local "
                                     "kernel from its source folder (kernel.yaml + package)")
        elif value is not None and declared[kind].convention(value)[0] is None:
            raise KernelHubError(
                f"mapping[{kind!r}] must be a repo id, {{'repo_id', 'version', 'revision'}}, a {{backend: repo id}} "
                f"dict, a LayerRepository, a loaded kernel or None; got {type(value).__name__} "
                f"({declared[kind].convention(value)[1]})"
            )
        specs[kind] = value
    return specs


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
