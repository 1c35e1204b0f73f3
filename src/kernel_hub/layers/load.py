"""The load job: the kernel a layer kind gets, as a loaded torch-facing module, or the reason it gets none.

Why one module: a mapping value (a repo id, a RepoSpec, a LocalSpec, an already loaded module, None) becomes a
kernel through get_kernel's one path (trust, digests, variant choice) and is then held to the kind's declared
convention (its `export`, or its `accepts`); a kernel that fails to load, or lacks the entry, leaves the model as it
is with the reason in the report, never an exception halfway through a swap. `kernel_info` is what each report row
says about the kernel that serves it.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from ..api import get_kernel, get_local_kernel
from .find import device_type
from .hf_compat import LocalSpec
from .plan import RepoSpec, not_validated_reason

if TYPE_CHECKING:
    import torch

    from .kinds.declaration import KindRun, LayerKind


def load(spec: object, backend: str) -> tuple[ModuleType, str]:
    """(kernel module, repo id) for a mapping value."""
    if isinstance(spec, RepoSpec):
        return get_kernel(spec.repo_id, version=spec.version, revision=spec.revision, framework="torch",
                          backend=backend, trust_remote_code=spec.trust), spec.repo_id
    if isinstance(spec, LocalSpec):
        kernel = get_local_kernel(spec.path, framework="torch", backend=backend)
        return kernel, getattr(kernel.__kernel_hub__, "repo_id", None) or str(spec.path)
    if not isinstance(spec, str):
        info = getattr(spec, "__kernel_hub__", None)
        # an already loaded kernel, passed through as the mapping documents
        return cast(ModuleType, spec), getattr(info, "repo_id", None) or getattr(spec, "__name__", type(spec).__name__)
    return get_kernel(spec, framework="torch", backend=backend), spec


def load_or_reason(spec: object, kind: LayerKind, backend: str) -> tuple[ModuleType | None, str, str]:
    """(kernel, repo id, "") or (None, "", why not) for a mapping value, held to `kind`'s convention."""
    if spec is None:
        return None, "", f"no kernel mapped to {kind.name} on {backend} (registry.yaml layers / mapping=)"
    try:
        kernel, repo_id = load(spec, backend)
    except Exception as exc:  # a kernel that fails to load leaves the model as it is
        lines = str(exc).splitlines() or [""]
        # a variant trace: its first line, and the line of the build kernelize wanted (torch-<backend>)
        wanted = [ln.strip() for ln in lines[1:] if ln.split()[1:2] == [f"torch-{backend}"]]
        return None, "", f"{spec} did not load: {type(exc).__name__}: {' '.join(lines[:1] + wanted[:1])}"
    convention, why = kind.convention(kernel)
    if convention is None:
        return None, "", f"{repo_id} {why} for {kind.name}"
    return kernel, repo_id, ""


def kernel_for(run: KindRun, *, runs_the_model: bool) -> tuple[ModuleType, str] | None:
    """(kernel, repo id) for a kind's run (`run.kind`), or None with a note "<kind> unchanged: why" in the report. A
    kind that reads its layers by running them (`runs_the_model`: attention's forwards, rms_norm's form) needs the
    model where the kernel's path runs: kernelizing for a TPU with the model elsewhere leaves the kind unchanged,
    saying so."""
    kind = run.kind.name
    if runs_the_model:
        unchecked = not_validated_reason(run.backend, device_type(run.model))
        if unchecked is not None and run.spec is not None:
            run.report.notes.append(f"{kind} unchanged: {unchecked.removeprefix('not validated: ')}")
            return None
    kernel, repo_id, reason = load_or_reason(run.spec, run.kind, run.backend)
    if kernel is None:
        run.report.notes.append(f"{kind} unchanged: {reason}")
        return None
    return kernel, repo_id


def kernel_info(kernel: object, device: torch.device, default: str) -> dict[str, Any]:
    """version / commit / variant / implementation of a loaded kernel, for its report rows."""
    hub = getattr(kernel, "__kernel_hub__", None)
    return {"version": getattr(hub, "version", None) or getattr(kernel, "__version__", None),
            "commit": getattr(hub, "commit", None) or str(getattr(hub, "path", "") or "") or None,
            "variant": _variant_label(hub),
            "implementation": _describe_impl(kernel, device, default)}


def _variant_label(hub: object) -> str | None:
    """The variant, marked "(no digest)" for a kernel-builder build checked only against the listing's blob ids."""
    variant = getattr(hub, "variant", None)
    verified = str(getattr(hub, "verified", "") or "")
    return f"{variant} (no digest)" if variant and verified.startswith("no digest") else variant


def _describe_impl(kernel: object, device: torch.device, default: str) -> str:
    for name in ("describe", "implementation_for"):
        fn = getattr(kernel, name, None)
        if callable(fn):
            try:
                return str(fn(device))
            except Exception:  # a kernel's self-description must never break kernelize
                continue
    return default
