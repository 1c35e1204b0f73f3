"""kernel.yaml: one kernel repo's metadata, read through a strict schema.

Everything in a kernel.yaml is untrusted: unknown keys are refused, names are checked with names.py before they
can touch a path, versions, specifiers, frameworks, backends and TPU generations come from fixed forms. Every
error is one line naming the file and the field to fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator

from ..decide.variants import Variant
from ..errors import KernelHubError, MetadataError
from ..names import (
    check_entry_file,
    check_python_name,
    check_relative_path,
    check_repo_id,
    check_variant_name,
    safe_join,
)

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

T = TypeVar("T")
METADATA_FILE = "kernel.yaml"
FRAMEWORKS = ("jax", "torch")
BACKENDS = ("tpu", "cuda", "rocm", "cpu", "universal")
#: Every generation system.py can report (a test keeps the two in step).
TPU_GENERATIONS = ("v2", "v3", "v4", "v5e", "v5p", "v6e", "v7x")
#: A release version: what the tag vX.Y.Z names.
_RELEASE = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
#: A distribution name (PEP 508).
_DIST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")


def checked_name(check: Callable[..., str], value: str, what: str) -> str:
    """names.py's check as a pydantic validator (which only turns ValueError into a field error)."""
    try:
        return check(value, what)
    except KernelHubError as exc:
        raise ValueError(str(exc)) from None


def unique(items: list[T], key: Callable[[T], str], what: str) -> list[T]:
    """`items`, or a ValueError naming the first key that appears twice."""
    seen: set[str] = set()
    for item in items:
        if key(item) in seen:
            raise ValueError(f"{what} {key(item)!r} is listed twice")
        seen.add(key(item))
    return items


def check_specifier(spec: str, what: str) -> str:
    """A non-empty PEP 440 specifier set such as ">=0.10,<0.11"."""
    try:
        SpecifierSet(spec)
    except InvalidSpecifier:
        raise ValueError(f"{what} {spec!r} is not a PEP 440 version specifier like '>=0.10,<0.11'") from None
    if not spec.strip():
        raise ValueError(f"{what} is empty; give a PEP 440 version specifier like '>=0.10'")
    return spec


def check_requirements(requires: dict[str, str]) -> dict[str, str]:
    """{distribution: specifier}, both checked."""
    for dist, spec in requires.items():
        if not _DIST.fullmatch(dist):
            raise ValueError(f"{dist!r} is not a distribution name")
        check_specifier(spec, f"the specifier for {dist}")
    return requires


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VariantSchema(_Strict):
    """One build variant of a kernel."""

    name: StrictStr
    framework: Literal[FRAMEWORKS]  # type: ignore[valid-type]
    backend: Literal[BACKENDS]  # type: ignore[valid-type]
    entry: StrictStr = "__init__.py"
    tpu_generations: list[Literal[TPU_GENERATIONS]] = Field(default_factory=list)  # type: ignore[valid-type]
    requires: dict[StrictStr, StrictStr] = Field(default_factory=dict)

    _name = field_validator("name")(lambda v: checked_name(check_variant_name, v, "variant name"))
    _entry = field_validator("entry")(lambda v: checked_name(check_entry_file, v, "entry"))
    _requires = field_validator("requires")(check_requirements)


class KernelSchema(_Strict):
    """The whole kernel.yaml."""

    name: StrictStr
    repo_id: StrictStr
    version: StrictStr
    description: StrictStr = ""
    license: StrictStr = ""
    python_name: StrictStr
    replaces: list[StrictStr] = Field(default_factory=list)
    vendor: list[StrictStr] = Field(default_factory=list)
    variants: list[VariantSchema] = Field(min_length=1)

    _name = field_validator("name")(lambda v: checked_name(check_python_name, v, "name"))
    _repo_id = field_validator("repo_id")(lambda v: checked_name(check_repo_id, v, "repo_id"))
    _python_name = field_validator("python_name")(lambda v: checked_name(check_python_name, v, "python_name"))

    @field_validator("version")
    @classmethod
    def _release(cls, v: str) -> str:
        if not _RELEASE.fullmatch(v):
            raise ValueError(f"{v!r} is not a release version like 1.0.0 (what the tag v1.0.0 names)")
        return v

    @field_validator("replaces")
    @classmethod
    def _layer_kinds(cls, kinds: list[str]) -> list[str]:
        return [checked_name(check_python_name, k, "layer kind") for k in kinds]

    @field_validator("vendor")
    @classmethod
    def _vendored(cls, files: list[str]) -> list[str]:
        for f in files:
            checked_name(check_relative_path, f, "vendored file")
            if not f.endswith(".py") or "/" in f or f == "__init__.py":
                raise ValueError(f"vendored file {f!r} must be a module at the top of kernels/pallas/_common, "
                                 "like 'dispatch.py'")
        return unique(files, str, "vendored file")

    _unique_variants = field_validator("variants")(lambda vs: unique(vs, lambda v: v.name, "variant name"))


@dataclass(frozen=True)
class KernelMetadata:
    name: str
    repo_id: str
    version: str
    python_name: str
    variants: tuple[Variant, ...]
    description: str = ""
    license: str = ""
    replaces: tuple[str, ...] = ()
    vendor: tuple[str, ...] = ()  # files of kernels/pallas/_common shipped as <python_name>/_vendor/<file>

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


def _field(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":
            out += " (a key)"
        else:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _problem(error: ErrorDetails) -> str:
    """One pydantic error as 'what to fix' text."""
    field = _field(error["loc"]) or "(top level)"
    if error["type"] == "missing":
        return f"missing required field {field!r}"
    if error["type"] == "extra_forbidden":
        return f"unknown field {field!r} (remove it or fix its spelling)"
    message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return f"field {field!r}: {message}"


def schema_error(where: str, exc: ValidationError, *, most: int = 5) -> MetadataError:
    """Every problem of a pydantic ValidationError (up to `most`, then a count) on one line: the file, each field,
    what to fix; so a file with two mistakes is fixed in one round."""
    problems = [_problem(e) for e in exc.errors(include_url=False)]
    shown = "; ".join(problems[:most])
    rest = len(problems) - most
    more = f" (and {rest} more problem{'s' if rest > 1 else ''})" if rest > 0 else ""
    return MetadataError(f"{where}: {shown}{more}")


def parse_metadata(data: object, where: str) -> KernelMetadata:
    """Check and convert the mapping read from a kernel.yaml."""
    if not isinstance(data, dict):
        raise MetadataError(f"{where}: expected a mapping of fields, got {type(data).__name__}")
    try:
        raw = KernelSchema.model_validate(data)
    except ValidationError as exc:
        raise schema_error(where, exc) from None
    variants = tuple(
        Variant(name=v.name, framework=v.framework, backend=v.backend, entry=v.entry,
                tpu_generations=tuple(v.tpu_generations), requires=tuple(v.requires.items()))
        for v in raw.variants
    )
    return KernelMetadata(
        name=raw.name, repo_id=raw.repo_id, version=raw.version, python_name=raw.python_name, variants=variants,
        description=raw.description, license=raw.license, replaces=tuple(raw.replaces), vendor=tuple(raw.vendor),
    )


def load_metadata(kernel_dir: Path) -> KernelMetadata:
    """Read `kernel_dir/kernel.yaml` and check that its package folder and every variant's entry exist."""
    path = Path(kernel_dir) / METADATA_FILE
    if not path.is_file():
        raise MetadataError(f"{kernel_dir}: no {METADATA_FILE} (every kernel folder needs one)")
    meta = parse_metadata(read_yaml(path), str(path))
    package = safe_join(Path(kernel_dir), meta.python_name)  # refuses a package folder that leads out of the kernel's
    if not (package / "__init__.py").is_file():
        raise MetadataError(f"{path}: python_name {meta.python_name!r} but {package}/__init__.py is missing")
    for v in meta.variants:
        if not (package / v.entry).is_file():
            raise MetadataError(f"{path}: field 'variants.{v.name}.entry': {v.entry} is not in {package}")
    return meta
