"""Import a verified build under a unique module name, so two versions can live in one process."""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .errors import KernelImportError
from .integrity import verify_tree
from .sources import Build

_lock = threading.Lock()
_loaded: dict[tuple[str, str, str], ModuleType] = {}


@dataclass(frozen=True)
class KernelInfo:
    """What was loaded: attached to every kernel module as `__kernel_hub__`."""

    repo_id: str
    version: str | None
    commit: str
    variant: str
    framework: str
    backend: str
    source: str
    path: Path


def module_name(build: Build) -> str:
    """A name no other (repo, commit, variant) shares and no real package uses."""
    package = re.sub(r"\W", "_", build.package_dir.name)
    variant = re.sub(r"\W", "_", build.variant.name)
    return f"_kernel_hub_{package}_{build.commit[:16]}_{variant}"


def _forget(name: str) -> None:
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


def import_build(build: Build) -> ModuleType:
    """Verify every digest of `build`, then import its variant entry as the package root.

    The entry file (e.g. torch_api.py for torch builds) is executed as the package's __init__ with the
    package folder as its search path, so its relative imports resolve exactly as in a published build.
    """
    key = (str(build.package_dir), build.commit, build.variant.name)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        label = f"{build.repo_id}@{(build.version or build.commit[:12])} [{build.variant.name}]"
        if build.digests:
            verify_tree(build.package_dir, build.digests, label)
        entry = build.package_dir / build.variant.entry
        if not entry.is_file():
            raise KernelImportError(f"{label}: entry file {build.variant.entry} is missing")
        name = module_name(build)
        spec = importlib.util.spec_from_file_location(
            name, entry, submodule_search_locations=[str(build.package_dir)]
        )
        if spec is None or spec.loader is None:
            raise KernelImportError(f"{label}: cannot import {entry}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            _forget(name)
            raise KernelImportError(f"{label}: import failed: {type(exc).__name__}: {exc}") from exc
        module.__kernel_hub__ = KernelInfo(  # type: ignore[attr-defined]
            repo_id=build.repo_id,
            version=build.version,
            commit=build.commit,
            variant=build.variant.name,
            framework=build.variant.framework,
            backend=build.variant.backend,
            source=build.source,
            path=Path(build.package_dir),
        )
        _loaded[key] = module
        return module


def public_names(module: ModuleType) -> list[str]:
    """A kernel's public surface is its __all__."""
    return list(getattr(module, "__all__", []))
