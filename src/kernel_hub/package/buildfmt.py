"""The build layout, in one place: what a published commit holds, what one build (variant) bundle holds, and
how metadata.json describes it. publish.py writes it, sources/hub/ reads it back.

A published commit:
  kernel.yaml, README.md                      the source metadata and card
  build/<variant>.tar                         every variant, one file: what kernel-hub downloads
  build/<torch-variant>/metadata.json         torch-facing variants exploded, for HF `kernels`
  build/<torch-variant>/symbols.json          their functions and layers (symbols.py), for `kernels describe-api`
  build/<torch-variant>/<python_name>/...     (entry file as the package __init__)
A bundle (`build/<variant>.tar`, reproducible: same files, same bytes) holds `metadata.json` and
`<python_name>/...`. metadata.json is HF kernels' format (name, id, version, backend, kernels-minver,
python-depends, digest: every file of the exploded folder, symbols.json included)
plus a `kernel-hub` section: release version, python_name, the variant's full description, the sha256 of
every file and, for a TPU variant, `tpu_compile`: the compile matrix publish's gate ran (compile_record.py).
Everything read back from a bundle or its metadata is hostile: names are checked with kernel_hub.names before
they touch a path, and a bundle is unpacked member by member, plain files only.
"""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import json
import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from ..decide.variants import DIALECTS, KERNEL_HUB, Variant
from ..errors import IntegrityError, KernelHubError, MetadataError
from ..json_types import JsonDict, JsonValue
from ..names import check_entry_file, check_python_name, check_relative_path, check_variant_name, safe_join
from .compile_record import TpuCompileRecord, parse_record
from .integrity import check_digests, combined_digest, native_code_reason, not_source_reason, sha256_file

REPO_TYPE = "kernel"
BUILD_DIR = "build"
BUNDLE_SUFFIX = ".tar"
VARIANT_METADATA = "metadata.json"
KH_KEY = "kernel-hub"          # our section inside the HF-format metadata.json
FRAMEWORKS = ("jax", "torch")
HF_BACKENDS = {"cpu": "cpu", "cuda": "cuda", "rocm": "rocm", "tpu": "tpu", "xpu": "xpu"}
MAX_BUNDLE_FILES = 4096
MAX_BUNDLE_BYTES = 512 << 20
#: The deepest nesting a metadata.json may have (a kernel's metadata needs 4 or 5 levels).
MAX_JSON_DEPTH = 32
#: The most bytes of a cached build's metadata.json read back (the published one, at most 1 MiB, plus our section).
MAX_CACHED_METADATA = 4 << 20
_PIECE = 1 << 20
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_WORD = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_BLOB_ID = re.compile(r"^[0-9a-f]{40}$")


def bundle_path(variant_name: str) -> str:
    """The repo path of a variant's bundle; the name is checked first."""
    return f"{BUILD_DIR}/{check_variant_name(variant_name)}{BUNDLE_SUFFIX}"


def bundle_variant(repo_path: str) -> str | None:
    """The variant a repo path `build/<variant>.tar` names, or None for any other path or an unsafe name."""
    if not repo_path.startswith(f"{BUILD_DIR}/") or not repo_path.endswith(BUNDLE_SUFFIX):
        return None
    name = repo_path[len(BUILD_DIR) + 1:-len(BUNDLE_SUFFIX)]
    try:
        return check_variant_name(name)
    except KernelHubError:
        return None


def is_blob_id(value: object) -> bool:
    return isinstance(value, str) and _BLOB_ID.fullmatch(value) is not None


def variant_from_name(name: str) -> Variant | None:
    """`jax-tpu` -> Variant(framework jax, backend tpu); names outside the convention -> None."""
    framework, _, backend = name.partition("-")
    if framework not in FRAMEWORKS or not _WORD.fullmatch(backend):
        return None
    return Variant(name=check_variant_name(name), framework=framework, backend=backend)


def variant_to_json(v: Variant) -> dict[str, Any]:
    out = {"name": v.name, "framework": v.framework, "backend": v.backend, "entry": v.entry,
           "tpu_generations": list(v.tpu_generations), "requires": dict(v.requires)}
    if v.dialect != KERNEL_HUB:  # our own bundles' JSON stays as it was
        out["dialect"] = v.dialect
    return out


def variant_from_json(d: object, what: str = "variant") -> Variant:
    """A variant description from a bundle, a cache or a lock file, every field checked."""
    if not isinstance(d, dict):
        raise MetadataError(f"{what}: expected a mapping, got {type(d).__name__}")
    name = check_variant_name(d.get("name"), f"{what} name")
    framework, backend = d.get("framework"), d.get("backend")
    if framework not in FRAMEWORKS:
        raise MetadataError(f"{what} {name}: framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    if not isinstance(backend, str) or not _WORD.fullmatch(backend):
        raise MetadataError(f"{what} {name}: backend must be a lowercase word, got {backend!r}")
    entry = check_entry_file(d.get("entry", "__init__.py"), f"{what} {name} entry")
    gens = d.get("tpu_generations") or []
    requires = d.get("requires") or {}
    if not isinstance(gens, list) or not all(isinstance(g, str) and _WORD.fullmatch(g) for g in gens):
        raise MetadataError(f"{what} {name}: tpu_generations must be a list of names like 'v5e'")
    if not isinstance(requires, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in
                                                 requires.items()):
        raise MetadataError(f"{what} {name}: requires must map a distribution to a version spec")
    dialect = d.get("dialect", KERNEL_HUB)
    if dialect not in DIALECTS:
        raise MetadataError(f"{what} {name}: dialect must be one of {', '.join(DIALECTS)}, got {str(dialect)[:40]!r}")
    return Variant(name=name, framework=framework, backend=backend, entry=entry, tpu_generations=tuple(gens),
                   requires=tuple(requires.items()), dialect=dialect)


def hf_name(python_name: str) -> str:
    """HF `kernels` names kernels in kebab case and imports `name.replace('-', '_')`."""
    name = python_name.replace("_", "-")
    if not name[:1].isalpha() or not name.replace("-", "").isalnum() or name != name.lower():
        raise MetadataError(f"python_name {python_name!r} cannot be an HF kernel name (lowercase, digits, _)")
    return name


def git_blob_id_bytes(data: bytes) -> str:
    """The id git gives these bytes as a file."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {len(data)}\0".encode())
    h.update(data)
    return h.hexdigest()


def git_blob_id(path: Path) -> str:
    """The id git (and so the Hub listing) gives a file's content."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- metadata.json ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildInfo:
    """The kernel-hub section of a build's metadata.json, checked."""

    python_name: str
    version: str | None
    variant: Variant
    sha256: dict[str, str]   # variant-relative path ("<python_name>/ops.py") -> sha256
    tpu_compile: TpuCompileRecord | None = None  # TPU variants: the compile matrix the release recorded
    #: how the fetched bytes were checked, for reports: kernel-builder builds say "metadata digest" or "no digest"
    verified: str = "sha256 (bundle metadata)"
    python_depends: tuple[str, ...] = ()          # kernel-builder metadata.json: PEP 508 requirements
    kernel_depends: tuple[tuple[str, str, str], ...] = ()  # (repo id, "version" | "revision", value)
    kernels_minver: str | None = None             # kernel-builder metadata.json: the HF kernels it needs (recorded)

    def package_digests(self) -> dict[str, str]:
        """Digests relative to the package folder, as the loader and lock files use them."""
        prefix = f"{self.python_name}/"
        return {k[len(prefix):]: v for k, v in self.sha256.items()}


#: The oldest HF `kernels` our torch builds are tested with and written for: it picks the `tpu` backend under
#: TorchTPU, reads symbols.json (`kernels describe-api`) and checks python-depends against its allowed list.
KERNELS_MINVER = "0.19.1"
#: The file in kernels' wheel that lists the python-depends it accepts (general and per backend).
KERNELS_DEPENDS_FILE = "_internals/python_depends.json"


def kernels_allowed_depends() -> dict[str, Any]:
    """HF kernels' allowed python-depends (its wheel's python_depends.json, read without importing kernels), or
    an empty list where kernels is not installed: then nothing is declared, which kernels always accepts."""
    import importlib.util

    spec = importlib.util.find_spec("kernels")
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    try:
        data = json.loads((origin.parent / KERNELS_DEPENDS_FILE).read_text()) if origin is not None else {}
    except (OSError, ValueError):
        data = {}
    return data if isinstance(data, dict) else {}


def python_depends(requires: tuple[tuple[str, str], ...], backend: str,
                   allowed: Mapping[str, object]) -> tuple[list[str], list[str]]:
    """(declared, undeclared): the variant's requirements HF kernels lets a build declare as python-depends (its
    general list and its backend's, by dependency name or Python package name), and the rest, which metadata.json
    cannot carry (kernels refuses a name outside its list: "uses unsupported kernel dependency"). torch is the
    runtime itself, never a dependency."""
    def names(table: object) -> dict[str, str]:
        out: dict[str, str] = {}
        for dep, info in (table or {}).items() if isinstance(table, dict) else ():
            out[str(dep)] = str(dep)
            for pkg in (info or {}).get("python", []) if isinstance(info, dict) else []:
                if isinstance(pkg, dict) and isinstance(pkg.get("pkg"), str):
                    out[pkg["pkg"]] = str(dep)
        return out

    backends = allowed.get("backends")
    known = {**names(allowed.get("general")),
             **names(backends.get(backend) if isinstance(backends, dict) else None)}
    declared, undeclared = [], []
    for dist, _ in requires:
        if dist == "torch":
            continue
        (declared if dist in known else undeclared).append(known.get(dist, dist))
    return sorted(set(declared)), sorted(set(undeclared))


def build_metadata(*, repo_id: str, version: str, python_name: str, license: str, variant: Variant,
                   variant_dir: Path, tpu_compile: JsonDict | None = None,
                   allowed_depends: Mapping[str, object] | None = None) -> dict[str, Any]:
    """metadata.json for the variant folder `variant_dir` (its package already in place, and symbols.json beside
    it for a torch variant); `tpu_compile`: a TPU variant's compile record (compile_record.py), checked against its
    schema before it is written. HF kernels' digest lists every file of the folder, symbols.json included; the
    kernel-hub section's sha256 lists the package's files (what our client verifies and imports)."""
    files = {p.relative_to(variant_dir).as_posix(): p for p in sorted(variant_dir.rglob("*")) if p.is_file()}
    every = {rel: sha256_file(p) for rel, p in files.items()}
    sha = {rel: h for rel, h in every.items() if rel.startswith(f"{python_name}/")}
    hf_digest = {rel: base64.b64encode(bytes.fromhex(h)).decode() for rel, h in every.items()}
    backend = HF_BACKENDS.get(variant.backend)
    if backend is None:
        raise MetadataError(f"variant {variant.name}: backend {variant.backend!r} has no HF kernels equivalent")
    built = Variant(name=variant.name, framework=variant.framework, backend=variant.backend, entry="__init__.py",
                    tpu_generations=variant.tpu_generations, requires=variant.requires)
    section: dict[str, Any] = {
        "repo_id": repo_id,
        "version": version,
        "python_name": python_name,
        "variant": variant_to_json(built),
        "sha256": sha,
    }
    if tpu_compile is not None:
        section["tpu_compile"] = parse_record(tpu_compile, f"{repo_id} [{variant.name}]").model_dump()
    declared, _ = python_depends(variant.requires, backend,
                                 kernels_allowed_depends() if allowed_depends is None else allowed_depends)
    return {
        "name": hf_name(python_name),
        "id": f"_{python_name}_{variant.name.replace('-', '_')}_{combined_digest(sha)[:10]}",
        "version": Version(version).major,
        "license": license or "unknown",
        "backend": {"type": backend},
        "kernels-minver": KERNELS_MINVER,
        "python-depends": declared,
        "digest": {"algorithm": "sha256", "files": hf_digest},
        KH_KEY: section,
    }


def parse_build_info(data: object, label: str, expected_variant: str) -> BuildInfo:
    """Check the kernel-hub section of a build's metadata.json: it must describe the variant it was fetched as,
    name a Python package, and record a sha256 for every file, all inside that package."""
    if not isinstance(data, dict) or not isinstance(data.get(KH_KEY), dict):
        raise IntegrityError(f"{label}: {VARIANT_METADATA} is missing or not a kernel-hub build")
    kh = data[KH_KEY]
    for key in ("variant", "python_name", "sha256"):
        if key not in kh:
            raise IntegrityError(f"{label}: {VARIANT_METADATA} has no {KH_KEY}.{key}")
    variant = variant_from_json(kh["variant"], f"{label}: {VARIANT_METADATA} variant")
    if variant.name != expected_variant:
        raise IntegrityError(
            f"{label}: {VARIANT_METADATA} describes variant {variant.name!r}, not the {expected_variant!r} it was "
            "fetched as")
    python_name = check_python_name(kh["python_name"], f"{label}: {VARIANT_METADATA} python_name")
    sha = check_digests(kh["sha256"], f"{label}: {VARIANT_METADATA}")
    outside = [k for k in sha if not k.startswith(f"{python_name}/")]
    if outside:
        raise IntegrityError(f"{label}: file {outside[0]} lies outside the package {python_name}/")
    if f"{python_name}/{variant.entry}" not in sha:
        raise IntegrityError(f"{label}: entry {variant.entry} is not among the build's files")
    version = kh.get("version")
    if version is not None:
        try:
            version = str(Version(str(version)))
        except InvalidVersion:
            shown = str(version)[:40]
            raise IntegrityError(f"{label}: {VARIANT_METADATA} version {shown!r} is not a release") from None
    record = parse_record(kh.get("tpu_compile"), label)
    extras = parse_builder_extras(kh, label)
    return BuildInfo(python_name=python_name, version=version, variant=variant, sha256=sha, tpu_compile=record,
                     **extras)


def parse_builder_extras(kh: Mapping[str, object], label: str) -> dict[str, Any]:
    """The fields a kernel-builder build's own record adds (sources/hub/builder.py writes them), each checked."""
    out: dict[str, Any] = {}
    if "verified" in kh:
        if not isinstance(kh["verified"], str) or len(kh["verified"]) > 200:
            raise IntegrityError(f"{label}: {VARIANT_METADATA} {KH_KEY}.verified is not a short text")
        out["verified"] = kh["verified"]
    deps = kh.get("python_depends", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) and len(d) < 200 for d in deps):
        raise IntegrityError(f"{label}: {VARIANT_METADATA} {KH_KEY}.python_depends is not a list of requirements")
    out["python_depends"] = tuple(deps)
    kdeps = kh.get("kernel_depends", [])
    if not isinstance(kdeps, list) or not all(
            isinstance(d, list) and len(d) == 3 and all(isinstance(x, str) for x in d) for d in kdeps):
        raise IntegrityError(f"{label}: {VARIANT_METADATA} {KH_KEY}.kernel_depends is not a list of [repo, kind, ref]")
    out["kernel_depends"] = tuple(tuple(d) for d in kdeps)
    minver = kh.get("kernels_minver")
    if minver is not None and (not isinstance(minver, str) or len(minver) > 40):
        raise IntegrityError(f"{label}: {VARIANT_METADATA} {KH_KEY}.kernels_minver is not a version")
    out["kernels_minver"] = minver
    return out


def read_build_info(folder: Path, label: str, expected_variant: str) -> BuildInfo:
    try:
        with open(folder / VARIANT_METADATA, "rb") as handle:
            raw = handle.read(MAX_CACHED_METADATA + 1)
    except OSError:
        raw = b""
    try:
        data = strict_json(raw, f"{label}: {VARIANT_METADATA}", MAX_CACHED_METADATA)
    except IntegrityError:
        data = None
    return parse_build_info(data, label, expected_variant)


def strict_json(data: bytes, what: str, max_bytes: int) -> Any:
    """JSON from anywhere untrusted: at most `max_bytes`, no key twice in one object, at most MAX_JSON_DEPTH
    levels deep. One IntegrityError naming `what` otherwise."""
    if len(data) > max_bytes:
        raise IntegrityError(f"{what} is larger than {max_bytes} bytes")

    def no_twice(pairs: list[tuple[str, JsonValue]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise IntegrityError(f"{what} names the key {key[:40]!r} twice in one object")
            out[key] = value
        return out

    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)  # nesting measured before parsing
    depth = max(itertools.accumulate(1 if c in b"[{" else -1 for c in brackets), default=0)
    if depth > MAX_JSON_DEPTH:
        raise IntegrityError(f"{what} is nested {depth} levels deep (at most {MAX_JSON_DEPTH})")
    try:
        return json.loads(data, object_pairs_hook=no_twice)
    except (ValueError, RecursionError):
        raise IntegrityError(f"{what} is not JSON") from None


class PathClaims:
    """The names an unpacking has written: refuses a name twice, or one name as both a file and a folder."""

    def __init__(self, what: str):
        self.what = what
        self.files: set[str] = set()
        self.folders: set[str] = set()

    def folder(self, rel: str) -> None:
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if prefix in self.files:
                raise IntegrityError(f"{self.what} holds {prefix} both as a file and a folder")
            self.folders.add(prefix)

    def file(self, rel: str) -> None:
        if rel in self.files:
            raise IntegrityError(f"{self.what} holds {rel} twice")
        if rel in self.folders:
            raise IntegrityError(f"{self.what} holds {rel} both as a file and a folder")
        if "/" in rel:
            self.folder(rel.rsplit("/", 1)[0])
        self.files.add(rel)


# -- bundles ------------------------------------------------------------------------------------------------


def write_bundle(variant_dir: Path, dest: Path, exclude: frozenset[str] = frozenset()) -> None:
    """A byte-for-byte reproducible tar of the variant folder (same files -> same bundle -> no-op upload);
    `exclude`: top-level files left out (symbols.json: for HF kernels, beside the exploded folder only)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in variant_dir.rglob("*") if p.is_file()
                           and p.relative_to(variant_dir).as_posix() not in exclude):
            data = path.read_bytes()
            info = tarfile.TarInfo(path.relative_to(variant_dir).as_posix())
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    dest.write_bytes(buf.getvalue())


def check_member_name(name: str, label: str) -> str:
    """A bundle member: metadata.json or a relative path of plain names that cannot run without its source."""
    rel = check_relative_path(name.rstrip("/") if name.endswith("/") else name, f"{label}: bundle entry")
    reason = not_source_reason(rel)
    if reason is not None:
        raise IntegrityError(f"{label}: bundle entry {rel} is {reason}; builds hold Python source only")
    return rel


def bundle_metadata_blob(bundle: Path) -> str | None:
    """The git blob id of a bundle's metadata.json (read with a bound), or None where it has none or is damaged (its
    unpacking then says what is wrong)."""
    try:
        with tarfile.open(bundle) as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_BUNDLE_FILES:
                    return None
                if member.name == VARIANT_METADATA and member.isfile() and member.size <= MAX_CACHED_METADATA:
                    source = tar.extractfile(member)
                    return git_blob_id_bytes(source.read(MAX_CACHED_METADATA + 1)) if source is not None else None
    except (tarfile.TarError, EOFError, OSError):
        return None
    return None


def unpack_bundle(bundle: Path, dest: Path, label: str, max_bytes: int = MAX_BUNDLE_BYTES) -> None:
    """Unpack into `dest` (a new folder) member by member: plain files and folders only, every name checked,
    nothing written outside `dest`, no native code (by name or content), at most `max_bytes` in all and
    MAX_BUNDLE_FILES entries; memory stays near one piece whatever the member's size."""
    dest.mkdir(parents=True)
    total = 0
    claims = PathClaims(f"{label}: bundle")
    try:
        with tarfile.open(bundle) as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_BUNDLE_FILES:
                    raise IntegrityError(f"{label}: bundle holds more than {MAX_BUNDLE_FILES} entries")
                if not (member.isfile() or member.isdir()):
                    raise IntegrityError(f"{label}: bundle entry {member.name[:80]!r} is a link or special file")
                rel = check_member_name(member.name, label)
                target = safe_join(dest, rel)
                if member.isdir():
                    claims.folder(rel)
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                claims.file(rel)
                total += member.size
                if total > max_bytes:
                    raise IntegrityError(f"{label}: bundle unpacks to more than {max_bytes} bytes "
                                         "(KERNEL_HUB_MAX_DOWNLOAD_BYTES sets the cap)")
                source = tar.extractfile(member)
                if source is None:
                    raise IntegrityError(f"{label}: bundle entry {rel} cannot be read")
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "xb") as out:
                    first = True
                    while piece := source.read(_PIECE):
                        if first and (reason := native_code_reason(piece[:1024])) is not None:
                            raise IntegrityError(f"{label}: bundle entry {rel} is {reason}; builds hold Python "
                                                 "source only")
                        first = False
                        out.write(piece)
    except (tarfile.TarError, EOFError) as exc:
        raise IntegrityError(f"{label}: bundle is damaged ({str(exc).splitlines()[0][:200] if str(exc) else exc!r})"
                             ) from None
