"""registry.yaml: the embedded catalogue of kernels and which kernel serves which layer kind."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from .errors import KernelNotFoundError, MetadataError
from .metadata import read_yaml

REGISTRY_ENV = "KERNEL_HUB_REGISTRY"


@dataclass(frozen=True)
class RegistryEntry:
    repo_id: str
    source: Path | None          # kernel folder with kernel.yaml; serves with no network
    version: str | None          # default spec when get_kernel gets neither version nor revision
    backends: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()
    hub_repo: str | None = None  # where the same kernel lives on the Hub, if elsewhere than repo_id
    bench: Path | None = None    # its benchmark script


@dataclass(frozen=True)
class Registry:
    path: Path | None
    entries: tuple[RegistryEntry, ...] = ()
    layers: dict[str, dict[str, str]] = field(default_factory=dict)  # layer kind -> backend -> repo id

    def get(self, repo_id: str) -> RegistryEntry | None:
        return next((e for e in self.entries if e.repo_id == repo_id), None)

    def require(self, repo_id: str) -> RegistryEntry:
        entry = self.get(repo_id)
        if entry is None:
            known = ", ".join(e.repo_id for e in self.entries) or "none"
            raise KernelNotFoundError(f"unknown kernel repo {repo_id!r} (registry has: {known})")
        return entry

    def repo_for_layer(self, layer_kind: str, backend: str) -> str | None:
        return self.layers.get(layer_kind, {}).get(backend)


class RegistryLocation(NamedTuple):
    path: Path
    origin: str  # "$KERNEL_HUB_REGISTRY", "checkout" or "embedded"

    def describe(self) -> str:
        return f"registry: {self.path} ({self.origin}{'' if self.path.is_file() else ', missing'})"


def registry_location(environ: Mapping[str, str] | None = None, package_dir: Path | None = None) -> RegistryLocation:
    """Which registry.yaml a default load reads, and why: $KERNEL_HUB_REGISTRY; else, running from a checkout
    (src/kernel_hub beside registry.yaml and pyproject.toml, as in an editable install), the checkout's own,
    so an edited kernel is used at once; else the copy embedded in the installed wheel."""
    env = (os.environ if environ is None else environ).get(REGISTRY_ENV)
    if env:
        return RegistryLocation(Path(env), f"${REGISTRY_ENV}")
    package = (package_dir or Path(__file__).resolve().parent).resolve()
    root = package.parent.parent
    if package.parent.name == "src" and (root / "registry.yaml").is_file() and (root / "pyproject.toml").is_file():
        return RegistryLocation(root / "registry.yaml", "checkout")
    return RegistryLocation(package / "_embedded" / "registry.yaml", "embedded")  # setup.py puts it there


def default_registry_path() -> Path:
    """See registry_location."""
    return registry_location().path


def parse_registry(data: Any, path: Path) -> Registry:
    """Check the mapping read from registry.yaml; source paths are relative to the file."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MetadataError(f"{path}: expected a mapping with 'kernels' and 'layers'")
    raw_entries = data.get("kernels") or []
    if not isinstance(raw_entries, list):
        raise MetadataError(f"{path}: 'kernels' must be a list")
    entries = []
    for i, raw in enumerate(raw_entries):
        if not isinstance(raw, dict) or not isinstance(raw.get("repo_id"), str):
            raise MetadataError(f"{path}: kernels[{i}] needs a 'repo_id' string")
        source = raw.get("source")
        version = raw.get("version")
        entries.append(
            RegistryEntry(
                repo_id=raw["repo_id"],
                source=(path.parent / source).resolve() if source else None,
                version=str(version) if version is not None else None,
                backends=tuple(raw.get("backends") or ()),
                layers=tuple(raw.get("layers") or ()),
                hub_repo=raw.get("hub"),
                bench=(path.parent / raw["bench"]).resolve() if raw.get("bench") else None,
            )
        )
    layers = data.get("layers") or {}
    if not isinstance(layers, dict) or not all(isinstance(v, dict) for v in layers.values()):
        raise MetadataError(f"{path}: 'layers' must map a layer kind to {{backend: repo_id}}")
    return Registry(path=path, entries=tuple(entries), layers={k: dict(v) for k, v in layers.items()})


@lru_cache(maxsize=8)
def _load(path: Path, mtime: float) -> Registry:
    return parse_registry(read_yaml(path), path)


def load_registry(path: Path | str | None = None) -> Registry:
    """The registry at `path` (default: see default_registry_path); empty if that file is absent."""
    target = Path(path) if path is not None else default_registry_path()
    if not target.is_file():
        if path is not None or os.environ.get(REGISTRY_ENV):
            raise MetadataError(f"registry file {target} not found")
        return Registry(path=None)
    return _load(target.resolve(), target.stat().st_mtime)
