"""Assembling a kernel package: its own files plus the shared code its kernel.yaml vendors.

Code shared by kernel packages lives once, in `_common/` beside the kernel folders (kernels/pallas/_common). A
kernel.yaml lists what it uses (`vendor: [dispatch.py, interpret.py]`); every assembly copies those files, with
`_common/__init__.py`, into the package as `<python_name>/_vendor/`, where the package imports them relatively
(`from ._vendor.dispatch import Dispatch`). One function, `assembled_files`, says which files make the package; the
local source (LocalSource), `kernel-hub publish` and the kernel tests all assemble from it, so digests and commit
ids cover vendored files exactly like the package's own. Source trees hold no links and no `_vendor/` folder: a
checked-in copy would drift from `_common/` (a user's kernel folder may link inside itself; never out of it).
An assembled package (one that vendors anything) also carries its kernel.yaml as `<python_name>/kernel.yaml` (never
checked in there): kernel.yaml is the one place a version is written, and a built package reads its own from that
copy (the vendored `_common/kernel_version.py`).
"""

from __future__ import annotations

import ast
import os
import shutil
import tempfile
from pathlib import Path

from ..decide.system import ASSEMBLED_PART
from ..decide.system import cache_root as system_cache_root
from ..errors import IntegrityError, MetadataError
from ..names import safe_join, safe_rmtree
from .integrity import combined_digest, package_files, sha256_file, verify_tree
from .metadata import METADATA_FILE, KernelMetadata, load_metadata

COMMON_DIR = "_common"
VENDOR_DIR = "_vendor"


#: This package's folder: the wheel embeds kernels/pallas/ under `_embedded/` (setup.py); a checkout holds it two
#: levels above src/kernel_hub.
_PACKAGE = Path(__file__).resolve().parents[1]  # the kernel_hub package


def shipped_common(package_dir: Path = _PACKAGE) -> Path | None:
    """The copy of kernels/pallas/_common that ships with kernel-hub: the wheel's embedded one, else the checkout's
    (an editable install), else None."""
    for candidate in (package_dir / "_embedded" / "kernels" / "pallas" / COMMON_DIR,
                      package_dir.parents[1] / "kernels" / "pallas" / COMMON_DIR):
        if (candidate / "__init__.py").is_file():
            return candidate
    return None


def common_dir(kernel_dir: Path, package_dir: Path = _PACKAGE) -> Path:
    """Where a kernel folder's vendored files come from: `_common/` beside it when there is one (our checkout, or an
    author's own shared folder), else the copy that ships with kernel-hub, so a kernel folder needs nothing beside
    it. The same files give the same digests, whichever copy they are read from."""
    beside = Path(kernel_dir).resolve().parent / COMMON_DIR
    if beside.is_dir():
        return beside
    return shipped_common(package_dir) or beside


def _own_files(kernel_dir: Path, package: Path) -> dict[str, Path]:
    """The package's own files, as publish reads a kernel folder (integrity.package_files: no caches, no dot
    files, a link out of the kernel folder refused), and never a checked-in `_vendor/`."""
    if os.path.lexists(package / VENDOR_DIR):
        raise MetadataError(f"{package / VENDOR_DIR} is checked in: {VENDOR_DIR}/ is assembled from kernel.yaml "
                            "`vendor`")
    if os.path.lexists(package / METADATA_FILE):
        raise MetadataError(f"{package / METADATA_FILE} is checked in: the package's {METADATA_FILE} is assembled "
                            f"from {Path(kernel_dir) / METADATA_FILE}")
    try:
        files = package_files(package, within=kernel_dir)
    except IntegrityError as exc:
        raise MetadataError(str(exc)) from None
    return {p.relative_to(package).as_posix(): p for p in files}


def _relative_imports(path: Path) -> set[str]:
    """Sibling modules a vendored file imports (`from .x import y`, `from . import x`); refuses anything that
    would reach out of _vendor/ (`from ..`) or into kernel_hub."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level > 1:
            raise MetadataError(f"{path}: a shared module may only import its siblings (found a '..' import)")
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        if any(n.split(".")[0] == "kernel_hub" for n in names):
            raise MetadataError(f"{path}: shared kernel code never imports kernel_hub")
    return found


def vendored_files(kernel_dir: Path, meta: KernelMetadata) -> dict[str, Path]:
    """`_vendor/<file>` -> its source in _common/ for every file kernel.yaml vendors (plus `_common/__init__.py`);
    each vendored file's sibling imports must be vendored too."""
    if not meta.vendor:
        return {}
    where = Path(kernel_dir) / METADATA_FILE
    common = common_dir(kernel_dir)
    out: dict[str, Path] = {}
    for name in ("__init__.py", *meta.vendor):
        src = safe_join(common, name)
        if src.is_symlink() or not src.is_file():
            raise MetadataError(f"{where}: field 'vendor': {name} is not a file in {common}")
        out[f"{VENDOR_DIR}/{name}"] = src
    for name in meta.vendor:
        for module in sorted(_relative_imports(common / name)):
            if f"{module}.py" not in meta.vendor:
                raise MetadataError(f"{where}: field 'vendor': {name} imports .{module}; add {module}.py")
    return out


def assembled_files(kernel_dir: Path, meta: KernelMetadata | None = None) -> dict[str, Path]:
    """Every file of the assembled package: path inside the package (POSIX) -> the file it is copied from (its own
    files; for a package that vendors shared code, the vendored files and the kernel folder's kernel.yaml)."""
    meta = meta or load_metadata(kernel_dir)
    package = safe_join(Path(kernel_dir), meta.python_name)  # the package folder may not lead out of the kernel's
    files = {**_own_files(kernel_dir, package), **vendored_files(kernel_dir, meta)}
    if meta.vendor:  # assembled anyway (a package vendoring nothing is imported in place, as it is)
        files[METADATA_FILE] = Path(kernel_dir) / METADATA_FILE
    return files


def file_digests(files: dict[str, Path]) -> dict[str, str]:
    """sha256 of every file, keyed by its path inside the package."""
    return {rel: sha256_file(src) for rel, src in sorted(files.items())}


def content_commit(kernel_dir: Path, meta: KernelMetadata, digests: dict[str, str]) -> str:
    """A commit id for the kernel's content: kernel.yaml and every assembled file, named as in the repo layout."""
    tree = {f"{meta.python_name}/{rel}": d for rel, d in digests.items()}
    tree[METADATA_FILE] = sha256_file(Path(kernel_dir) / METADATA_FILE)
    return combined_digest(tree)[:40]


def assemble(kernel_dir: Path, dest_root: Path, meta: KernelMetadata | None = None) -> Path:
    """Copy the assembled package to `dest_root/<python_name>/` (as plain files) and return that folder."""
    meta = meta or load_metadata(kernel_dir)
    files = assembled_files(kernel_dir, meta)
    package = Path(dest_root) / meta.python_name
    for rel, src in files.items():
        dest = package / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    return package


def cache_root() -> Path:
    """Where assembled packages of local kernel folders live, one folder per content commit."""
    return system_cache_root(ASSEMBLED_PART)


def assembled_in_cache(kernel_dir: Path, meta: KernelMetadata, digests: dict[str, str], commit: str) -> Path:
    """The package assembled once per commit under cache_root(), verified against `digests`; a cache entry that
    fails verification is rebuilt, and a new one appears whole or not at all (built aside, then renamed)."""
    cache = cache_root()
    entry = cache / f"{meta.python_name}-{commit[:16]}"
    package = entry / meta.python_name
    if entry.is_dir():
        try:
            verify_tree(package, digests, f"assembled {meta.repo_id}")
            return package
        except IntegrityError:
            safe_rmtree(cache, entry)
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".assembling-", dir=cache))
    try:
        assemble(kernel_dir, staging, meta)
        verify_tree(staging / meta.python_name, digests, f"assembled {meta.repo_id}")  # the source moved under us
        os.rename(staging, entry)
    except OSError:
        if not entry.is_dir():
            raise
        # another process assembled the same commit first: theirs is used (and verified before import)
    finally:
        if staging.exists():
            safe_rmtree(cache, staging)
    return package
