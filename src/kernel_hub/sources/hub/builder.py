"""The kernel-builder dialect's files: what a `build/<variant>/` tree's metadata.json says, which fetched bytes
each file must have, where its package lies (`build/V/<name>/`, `build/V/` itself, or `build/V/<id>.zip`), and
the folder kernel-hub imports from (the same shape as an unpacked bundle: metadata.json + `<python_name>/`).

Everything here is hostile input: metadata.json, the tree listing and the zip come from a server. Names are checked
before they touch a path; every byte is checked (against metadata.json's sha256 `digest`, or where it has none
against the git blob id the listing gave) before it is written where the loader looks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement

from ...decide.builder_names import parse_builder_name
from ...decide.system import installed_version
from ...decide.variants import KERNEL_BUILDER, Variant
from ...errors import IntegrityError, KernelHubError, MetadataError
from ...names import check_python_name, check_relative_path, check_repo_id, safe_join
from ...package.buildfmt import (
    KH_KEY,
    MAX_BUNDLE_FILES,
    VARIANT_METADATA,
    PathClaims,
    check_member_name,
    strict_json,
    variant_to_json,
)
from ...package.integrity import native_code_reason

SIGNATURE = "metadata.json.sigstore"   # kernel-builder's signature bundle: not code, not in the digest
NOT_IN_DIGEST = frozenset({VARIANT_METADATA, SIGNATURE})
WITH_DIGEST = "sha256 (metadata.json digest)"
NO_DIGEST = "no digest: git blob ids of the tree listing"
_KEBAB = re.compile(r"^[a-z][-a-z0-9]*[a-z0-9]$")
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
#: The most bytes of a variant's metadata.json that are read (a longer one is refused unread).
MAX_METADATA_BYTES = 1 << 20
#: The most python-depends entries one variant may declare.
MAX_PYTHON_DEPENDS = 64
#: The most kernel-depends entries one variant may declare.
MAX_KERNEL_DEPENDS = 64
#: A zip may unpack to at most this many times its own size (or ZIP_FLOOR_BYTES, whichever is more): Python
#: source deflates about 3-10 to 1; a zip bomb by 1000 to 1.
MAX_ZIP_RATIO = 100
ZIP_FLOOR_BYTES = 16 << 20
_ZIP_PIECE = 1 << 20


@dataclass(frozen=True)
class BuilderMetadata:
    """metadata.json of one kernel-builder variant, checked."""

    name: str                                   # kebab case; the package imports as name.replace("-", "_")
    python_name: str
    id: str
    layout: str                                 # "files" | "zip"
    kernels_minver: str | None
    python_depends: tuple[str, ...]
    kernel_depends: tuple[tuple[str, str, str], ...]
    digest: dict[str, str] | None               # variant-relative path -> sha256 hex; None: none published
    raw: dict[str, Any]


def _digest(raw: object, label: str) -> dict[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or str(raw.get("algorithm", "")).lower() != "sha256" or not isinstance(
            raw.get("files"), dict):
        raise IntegrityError(f"{label}: metadata.json digest must be {{algorithm: sha256, files: {{path: base64}}}}")
    out = {}
    for rel, b64 in raw["files"].items():
        check_relative_path(rel, f"{label}: digest file")
        try:
            raw_hash = base64.b64decode(str(b64), validate=True)
        except (binascii.Error, ValueError):
            raw_hash = b""
        if len(raw_hash) != 32:
            raise IntegrityError(f"{label}: digest of file {rel} is not a base64 sha256")
        out[rel] = raw_hash.hex()
    return out


def parse_builder_metadata(data: bytes, label: str) -> BuilderMetadata:
    """A kernel-builder metadata.json; one error naming the field that is wrong."""
    raw = strict_json(data, f"{label}: metadata.json", MAX_METADATA_BYTES)
    if not isinstance(raw, dict):
        raise IntegrityError(f"{label}: metadata.json is not a JSON object")
    name = raw.get("name")
    if not isinstance(name, str) or not _KEBAB.fullmatch(name) or len(name) > 64:
        raise MetadataError(f"{label}: metadata.json name {str(name)[:40]!r} is not a kernel name like 'ragged-dot'")
    python_name = check_python_name(name.replace("-", "_"), f"{label}: metadata.json name")
    kid = raw.get("id", python_name)
    if not isinstance(kid, str) or not _ID.fullmatch(kid):
        raise MetadataError(f"{label}: metadata.json id {str(kid)[:40]!r} is not a plain file name")
    layout = raw.get("build-layout", "files")
    layout = layout.lower() if isinstance(layout, str) else layout
    if layout not in ("files", "zip"):
        raise MetadataError(f"{label}: metadata.json build-layout must be 'files' or 'zip', got {str(layout)[:20]!r}")
    minver = raw.get("kernels-minver")
    if minver is not None and (not isinstance(minver, str) or not re.fullmatch(r"\d+(\.\d+){0,3}", minver)):
        raise MetadataError(f"{label}: metadata.json kernels-minver {str(minver)[:20]!r} is not a version")
    pydeps = raw.get("python-depends") or []
    if not isinstance(pydeps, list) or not all(isinstance(d, str) and len(d) < 200 for d in pydeps):
        raise MetadataError(f"{label}: metadata.json python-depends must be a list of package names")
    if len(pydeps) > MAX_PYTHON_DEPENDS:
        raise MetadataError(f"{label}: metadata.json lists {len(pydeps)} python-depends (at most "
                            f"{MAX_PYTHON_DEPENDS})")
    return BuilderMetadata(name=name, python_name=python_name, id=kid, layout=layout, kernels_minver=minver,
                           python_depends=tuple(pydeps), kernel_depends=_kernel_depends(raw.get("kernel-depends"),
                                                                                          label),
                           digest=_digest(raw.get("digest"), label), raw=raw)


def _kernel_depends(raw: object, label: str) -> tuple[tuple[str, str, str], ...]:
    """kernel-depends: [{repo-id, version: int} | {repo-id, revision: str}] -> (repo, kind, value)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MetadataError(f"{label}: metadata.json kernel-depends must be a list, got {type(raw).__name__}")
    if len(raw) > MAX_KERNEL_DEPENDS:
        raise MetadataError(f"{label}: metadata.json lists {len(raw)} kernel-depends (at most {MAX_KERNEL_DEPENDS})")
    out = []
    for dep in raw:
        if not isinstance(dep, dict) or set(dep) - {"repo-id", "version", "revision"}:
            raise MetadataError(f"{label}: metadata.json kernel-depends entries are {{repo-id, version | revision}}")
        repo = check_repo_id(dep.get("repo-id"), f"{label}: kernel-depends repo-id")
        version, revision = dep.get("version"), dep.get("revision")
        if (version is None) == (revision is None):
            raise MetadataError(f"{label}: kernel-depends {repo} needs exactly one of version, revision")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
            raise MetadataError(f"{label}: kernel-depends {repo} version must be an int major")
        if revision is not None and (not isinstance(revision, str) or not revision or len(revision) > 128):
            raise MetadataError(f"{label}: kernel-depends {repo} revision must be a ref or commit")
        out.append((repo, "version", str(version)) if version is not None else (repo, "revision", revision))
    return tuple(out)


def missing_python_depends(requirements: tuple[str, ...],
                           installed: Callable[[str], str | None] = installed_version) -> str | None:
    """The first requirement this environment does not meet, said in one line (None: all met). A requirement whose
    environment marker is false here is not needed; one whose marker cannot be evaluated is refused. `installed`:
    distribution -> version or None (injectable)."""
    if len(requirements) > MAX_PYTHON_DEPENDS:
        return f"{len(requirements)} python-depends entries (at most {MAX_PYTHON_DEPENDS})"
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            return f"python-depends entry {text[:60]!r} is not a package requirement"
        if req.marker is not None:
            try:
                if not req.marker.evaluate({"extra": ""}):
                    continue
            except (UndefinedComparison, UndefinedEnvironmentName, ValueError, TypeError):
                return f"python-depends entry {text[:60]!r} has a marker that cannot be evaluated here"
        have = installed(req.name)
        if have is None:
            return f"needs the Python package {req.name} (python-depends), which is not installed: pip install " \
                   f"{req.name}"
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            return f"needs {req} (python-depends), have {req.name} {have}"
    return None


def check_python_depends(requirements: tuple[str, ...], label: str) -> None:
    problem = missing_python_depends(requirements)
    if problem:
        raise KernelHubError(f"{label}: {problem}")


def expected_files(meta: BuilderMetadata, listed: dict[str, str], label: str) -> dict[str, tuple[str, str]]:
    """Every file of the variant but its metadata -> ("sha256" | "blob", the value its bytes must hash to).

    With a digest, the listing and the digest must name the same files: one the digest leaves out, or one it
    names that the repo lacks, is one error naming that file. Without one, the listing's git blob ids stand."""
    files = {rel: blob for rel, blob in listed.items() if rel not in NOT_IN_DIGEST}
    if meta.digest is None:
        return {rel: ("blob", blob) for rel, blob in files.items()}
    for rel in sorted(files):
        if rel not in meta.digest:
            raise IntegrityError(f"{label}: file {rel} is not in metadata.json's digest; refused before any import")
    for rel in sorted(meta.digest):
        if rel not in files:
            raise IntegrityError(f"{label}: file {rel} of metadata.json's digest is not in the repo")
    return {rel: ("sha256", meta.digest[rel]) for rel in files}


def package_files(meta: BuilderMetadata, files: list[str], label: str) -> tuple[str, str]:
    """Where the package lies among the variant's files: ("zip", "<id>.zip"), ("package", "<name>/") or
    ("root", "")."""
    if meta.layout == "zip":
        archive = f"{meta.id}.zip"
        if archive not in files:
            raise IntegrityError(f"{label}: build-layout zip, but {archive} is not in the variant")
        return "zip", archive
    if f"{meta.python_name}/__init__.py" in files:
        return "package", f"{meta.python_name}/"
    if "__init__.py" in files:
        return "root", ""
    raise IntegrityError(f"{label}: neither {meta.python_name}/__init__.py nor __init__.py is in the variant")


def unzip_to(data: bytes, write: Callable[[str, Iterable[bytes]], None], label: str, max_bytes: int) -> int:
    """Unpack a verified zip member by member through `write(rel, pieces)`: plain files, names checked, stored or
    deflate entries only, no encrypted entry, no name both a file and a folder, no native code or bytecode. At most
    `max_bytes` in all and MAX_ZIP_RATIO times the zip's size (ZIP_FLOOR_BYTES at least), counted as it inflates;
    memory stays near one piece (_ZIP_PIECE). Returns the bytes unpacked."""
    limit = min(max_bytes, max(MAX_ZIP_RATIO * len(data), ZIP_FLOOR_BYTES))
    claims = PathClaims(f"{label}: zip")
    total = 0
    seen_init = False
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
            if len(members) > MAX_BUNDLE_FILES:
                raise IntegrityError(f"{label}: zip holds more than {MAX_BUNDLE_FILES} entries")
            for info in members:
                shown = info.filename[:80]
                if info.flag_bits & 0x1:
                    raise IntegrityError(f"{label}: zip entry {shown!r} is encrypted")
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise IntegrityError(f"{label}: zip entry {shown!r} uses compression method "
                                         f"{info.compress_type} (only stored or deflate)")
                if (info.external_attr >> 16) & 0o170000 not in (0, 0o100000, 0o040000):
                    raise IntegrityError(f"{label}: zip entry {shown!r} is a link or special file")
                rel = check_member_name(info.filename, f"{label}: zip")
                if info.is_dir():
                    claims.folder(rel)
                    continue
                claims.file(rel)
                seen_init = seen_init or rel == "__init__.py"

                def pieces(entry: zipfile.ZipInfo = info, rel: str = rel) -> Iterator[bytes]:
                    nonlocal total
                    first = True
                    with archive.open(entry) as source:
                        while piece := source.read(_ZIP_PIECE):
                            if first and (reason := native_code_reason(piece[:1024])) is not None:
                                raise IntegrityError(f"{label}: zip entry {rel} is {reason}; builds hold Python "
                                                     "source only")
                            first = False
                            total += len(piece)
                            if total > limit:
                                raise IntegrityError(
                                    f"{label}: zip unpacks to more than {limit} bytes (a zip may unpack to "
                                    f"{MAX_ZIP_RATIO}x its size, at least {ZIP_FLOOR_BYTES >> 20} MiB, and a build "
                                    f"to KERNEL_HUB_MAX_DOWNLOAD_BYTES={max_bytes})")
                            yield piece

                write(rel, pieces())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, NotImplementedError, RuntimeError,
            OverflowError) as exc:
        raise IntegrityError(f"{label}: zip is damaged ({type(exc).__name__}: {str(exc)[:100]})") from None
    if not seen_init:
        raise IntegrityError(f"{label}: zip has no __init__.py at its top")
    return total


def unzip_package(data: bytes, label: str, max_bytes: int = 512 << 20) -> dict[str, bytes]:
    """The package files of a verified zip (unzip_to's checks), in memory: for small zips and tests."""
    out: dict[str, bytes] = {}

    def keep(rel: str, pieces: Iterable[bytes]) -> None:
        out[rel] = b"".join(pieces)

    unzip_to(data, keep, label, max_bytes)
    return out


class BuildWriter:
    """The import folder, written one checked file at a time (memory: one file): `<python_name>/` with the
    package's bytes, then (finish) a metadata.json that is the published one plus our section (what the
    unpacked-build check and the loader read back)."""

    def __init__(self, dest: Path, meta: BuilderMetadata, label: str):
        self.dest, self.meta, self.label = dest, meta, label
        self.sha: dict[str, str] = {}
        self._claims = PathClaims(label)
        dest.mkdir(parents=True)

    def add(self, rel: str, pieces: Iterable[bytes]) -> None:
        """One package file (`rel` inside the package) from its bytes in pieces; no bytecode, no native code (by
        name or by content)."""
        check_member_name(rel, self.label)  # only source the loader checks will run
        self._claims.file(rel)
        target = safe_join(self.dest, self.meta.python_name, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        head = b""
        with open(target, "xb") as out:
            for piece in pieces:
                if len(head) < 1024:
                    head += piece[:1024]
                    reason = native_code_reason(head)
                    if reason is not None:
                        raise IntegrityError(f"{self.label}: file {rel} is {reason}; builds hold Python source only")
                digest.update(piece)
                out.write(piece)
        self.sha[f"{self.meta.python_name}/{rel}"] = digest.hexdigest()

    def finish(self, variant: Variant, verified: str, repo_id: str) -> None:
        built = Variant(name=variant.name, framework=variant.framework, backend=variant.backend,
                        entry="__init__.py", dialect=variant.dialect)
        record = dict(self.meta.raw)
        record[KH_KEY] = {"repo_id": repo_id, "version": None, "python_name": self.meta.python_name,
                          "variant": variant_to_json(built), "sha256": self.sha, "verified": verified,
                          "python_depends": list(self.meta.python_depends),
                          "kernel_depends": [list(d) for d in self.meta.kernel_depends],
                          "kernels_minver": self.meta.kernels_minver}
        (self.dest / VARIANT_METADATA).write_text(json.dumps(record, indent=1, sort_keys=True))


def builder_variant(name: str) -> Variant:
    """A kernel-builder tree as a variant: its name says framework and backend (builder_names.py); a name it
    cannot read stays in the trace, rejected with that reason."""
    named = parse_builder_name(name)
    return Variant(name=name, framework="torch", backend=named.backend if named else "unknown",
                   dialect=KERNEL_BUILDER)
