"""kernel.yaml: one kernel repo's metadata, read and checked with errors that name the field to fix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from .errors import MetadataError
from .variants import Variant

METADATA_FILE = "kernel.yaml"
FRAMEWORKS = ("jax", "torch")


@dataclass(frozen=True)
class KernelMetadata:
    name: str
    repo_id: str
    version: str
    python_name: str
    variants: tuple[Variant, ...]
    description: str = ""
    license: str = ""
    validation: str | None = None
    replaces: tuple[str, ...] = ()
    python_dependencies: tuple[tuple[str, str], ...] = ()

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise MetadataError(f"{self.repo_id} has no variant {name!r} (has: {', '.join(self.variant_names)})")

    @property
    def variant_names(self) -> list[str]:
        return [v.name for v in self.variants]


def read_yaml(path: Path) -> Any:
    """Parse a YAML file, turning syntax errors into one line naming the file and position."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise MetadataError(f"{path} not found") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise MetadataError(f"{path}{where}: malformed YAML ({problem})") from None


def _need(data: dict[str, Any], key: str, where: str, kind: type = str) -> Any:
    if key not in data:
        raise MetadataError(f"{where}: missing required field {key!r}")
    value = data[key]
    if not isinstance(value, kind):
        raise MetadataError(f"{where}: field {key!r} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def _variant(raw: Any, where: str) -> Variant:
    if not isinstance(raw, dict):
        raise MetadataError(f"{where}: each variant must be a mapping")
    name = _need(raw, "name", where)
    here = f"{where} variant {name!r}"
    framework = _need(raw, "framework", here)
    if framework not in FRAMEWORKS:
        raise MetadataError(f"{here}: framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    requires = raw.get("requires") or {}
    if not isinstance(requires, dict):
        raise MetadataError(f"{here}: 'requires' must map a distribution to a version spec")
    entry = raw.get("entry", "__init__.py")
    if "/" in entry or not entry.endswith(".py"):
        raise MetadataError(f"{here}: entry must be a .py file inside the package, got {entry!r}")
    return Variant(
        name=name,
        framework=framework,
        backend=_need(raw, "backend", here),
        entry=entry,
        tpu_generations=tuple(raw.get("tpu_generations") or ()),
        requires=tuple((str(k), str(v)) for k, v in requires.items()),
    )


def parse_metadata(data: Any, where: str) -> KernelMetadata:
    """Check and convert the mapping read from a kernel.yaml."""
    if not isinstance(data, dict):
        raise MetadataError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
    version = str(_need(data, "version", where))
    try:
        Version(version)
    except InvalidVersion:
        raise MetadataError(f"{where}: version {version!r} is not a release version like 1.0.0") from None
    repo_id = _need(data, "repo_id", where)
    if repo_id.count("/") != 1:
        raise MetadataError(f"{where}: repo_id must look like ORG/NAME, got {repo_id!r}")
    raw_variants = _need(data, "variants", where, list)
    if not raw_variants:
        raise MetadataError(f"{where}: 'variants' is empty")
    variants = tuple(_variant(v, where) for v in raw_variants)
    deps = data.get("python_dependencies") or {}
    return KernelMetadata(
        name=_need(data, "name", where),
        repo_id=repo_id,
        version=version,
        python_name=_need(data, "python_name", where),
        variants=variants,
        description=str(data.get("description", "")),
        license=str(data.get("license", "")),
        validation=data.get("validation"),
        replaces=tuple(data.get("replaces") or ()),
        python_dependencies=tuple((str(k), str(v)) for k, v in deps.items()),
    )


def load_metadata(kernel_dir: Path) -> KernelMetadata:
    """Read `kernel_dir/kernel.yaml` and check that its package folder exists."""
    path = Path(kernel_dir) / METADATA_FILE
    if not path.is_file():
        raise MetadataError(f"{kernel_dir}: no {METADATA_FILE} (every kernel folder needs one)")
    meta = parse_metadata(read_yaml(path), str(path))
    package = Path(kernel_dir) / meta.python_name
    if not (package / "__init__.py").is_file():
        raise MetadataError(f"{path}: python_name {meta.python_name!r} but {package}/__init__.py is missing")
    return meta
