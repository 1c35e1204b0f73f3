"""registry.yaml: the embedded catalogue of kernels and which kernel serves which layer kind.

Read through a strict schema like kernel.yaml: unknown keys are refused, repo ids and layer kinds are checked with
names.py, version specs must parse, backends come from a fixed set; every error is one line naming the file and field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator

from ..decide.versions import parse_spec
from ..errors import KernelHubError, KernelNotFoundError, MetadataError
from ..names import check_python_name, check_repo_id
from ..package.checkout import checkout_root
from ..package.metadata import checked_name, read_yaml, schema_error, unique

REGISTRY_ENV = "KERNEL_HUB_REGISTRY"
#: Backends a registry entry and its layer mapping may name.
REGISTRY_BACKENDS = ("tpu", "cuda", "rocm", "cpu")


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
    package = (package_dir or Path(__file__).resolve().parents[1]).resolve()
    root = checkout_root(package)
    if root is not None and (root / "registry.yaml").is_file():
        return RegistryLocation(root / "registry.yaml", "checkout")
    return RegistryLocation(package / "_embedded" / "registry.yaml", "embedded")  # setup.py puts it there


def default_registry_path() -> Path:
    """See registry_location."""
    return registry_location().path


class _EntrySchema(BaseModel):
    """One kernel of registry.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo_id: StrictStr
    source: StrictStr | None = None
    hub: StrictStr | None = None
    version: StrictStr | None = None
    backends: list[Literal[REGISTRY_BACKENDS]] = Field(default_factory=list)  # type: ignore[valid-type]
    layers: list[StrictStr] = Field(default_factory=list)
    bench: StrictStr | None = None

    _repo_id = field_validator("repo_id")(lambda v: checked_name(check_repo_id, v, "repo_id"))
    _hub = field_validator("hub")(lambda v: v if v is None else checked_name(check_repo_id, v, "hub"))
    _layers = field_validator("layers")(lambda kinds: [checked_name(check_python_name, k, "layer kind") for k in kinds])

    @field_validator("version")
    @classmethod
    def _spec(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_spec(v)
            except KernelHubError as exc:
                raise ValueError(str(exc)) from None
        return v


class _RegistrySchema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kernels: list[_EntrySchema] = Field(default_factory=list)
    layers: dict[StrictStr, dict[Literal[REGISTRY_BACKENDS], StrictStr | None]] = Field(  # type: ignore[valid-type]
        default_factory=dict)

    _unique = field_validator("kernels")(lambda entries: unique(entries, lambda e: e.repo_id, "repo_id"))

    @field_validator("layers")
    @classmethod
    def _layer_repos(cls, layers: dict[str, dict[str, str | None]]) -> dict[str, dict[str, str | None]]:
        for kind, per_backend in layers.items():
            checked_name(check_python_name, kind, "layer kind")
            for repo in per_backend.values():
                if repo is not None:
                    checked_name(check_repo_id, repo, f"layers.{kind}")
        return layers


def parse_registry(data: object, path: Path) -> Registry:
    """Check the mapping read from registry.yaml (strict: unknown keys are refused); source and bench paths are
    relative to the file."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise MetadataError(f"{path}: expected a mapping with 'kernels' and 'layers'")
    try:
        raw = _RegistrySchema.model_validate(data)
    except ValidationError as exc:
        raise schema_error(str(path), exc) from None
    entries = tuple(
        RegistryEntry(
            repo_id=e.repo_id,
            source=(path.parent / e.source).resolve() if e.source else None,
            version=e.version,
            backends=tuple(e.backends),
            layers=tuple(e.layers),
            hub_repo=e.hub,
            bench=(path.parent / e.bench).resolve() if e.bench else None,
        )
        for e in raw.kernels
    )
    layers = {kind: {b: r for b, r in per.items() if r is not None} for kind, per in raw.layers.items()}
    return Registry(path=path, entries=entries, layers=layers)


@lru_cache(maxsize=8)
def _load(path: Path, mtime: float) -> Registry:
    return parse_registry(read_yaml(path), path)


def load_registry(path: Path | str | None = None) -> Registry:
    """Read registry.yaml: which kernels exist, where they come from and which layers they serve.

    Args:
        path: the registry file (default: default_registry_path, which KERNEL_HUB_REGISTRY can set).

    Returns:
        The Registry; empty when no path was asked for and the default file is absent.

    Raises:
        MetadataError: an asked-for file is missing or the file does not hold to the schema.
    """
    target = Path(path) if path is not None else default_registry_path()
    if not target.is_file():
        if path is not None or os.environ.get(REGISTRY_ENV):
            raise MetadataError(f"registry file {target} not found")
        return Registry(path=None)
    return _load(target.resolve(), target.stat().st_mtime)
