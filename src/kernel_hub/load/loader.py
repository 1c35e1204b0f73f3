"""Import a verified build under a unique module name, so two versions can live in one process.

Only verified source runs. Every module of a kernel (the entry, and each submodule it imports, relatively or
later through importlib) is found by a finder that knows only the build's digest-checked files. Their bytes are
read once, when the build is imported, checked against their sha256 and kept: a submodule imported later (the
validation module, a lazy import) compiles those very bytes, so a file changed or removed afterwards (a cache
pruned by another process) changes nothing of what runs. No .pyc is read or written for them, a file outside the
digests is not importable, and Python's own path finders never see the kernel's names.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from ..decide.hf_conventions import minver_decision
from ..errors import IntegrityError, KernelHubError, KernelImportError
from ..names import check_entry_file, check_variant_name
from ..package.integrity import check_digests, sha256_bytes, verify_tree
from ..sources.base import Build


class VanishedError(KernelImportError):
    """A build's files disappeared while it was being verified or imported (another process pruned the cache)."""


T = TypeVar("T")
_lock = threading.RLock()
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
    verified: str = ""                     # how its bytes were checked ("no digest: ..." for such a build)
    kernels_minver: str | None = None      # kernel-builder metadata: the HF kernels version it was built for


@dataclass(frozen=True)
class _Tree:
    """One imported build: its package folder, the digests its files must match, and its entry file."""

    package_dir: Path
    digests: dict[str, str]
    entry: str
    label: str
    sources: dict[str, bytes]  # every verified .py file's bytes, read once at import_build


class _VerifiedLoader(importlib.abc.Loader):
    """Runs one module from its checked source bytes; never touches bytecode."""

    def __init__(self, tree: _Tree, rel: str):
        self.tree, self.rel = tree, rel
        self.path = tree.package_dir.joinpath(*rel.split("/"))

    def _source_bytes(self) -> bytes:
        return self.tree.sources[self.rel]

    def _checked_bytes(self, rel: str) -> bytes:
        data = self.tree.package_dir.joinpath(*rel.split("/")).read_bytes()
        if sha256_bytes(data) != self.tree.digests[rel]:
            raise IntegrityError(f"{self.tree.label}: file {rel} changed after it was verified")
        return data

    def get_data(self, path: str) -> bytes:
        """A data file of the build by its path (importlib's ResourceLoader: how a kernel reads its C sources):
        only a file among the build's digests, its bytes checked against its sha256 as they are read. OSError for
        any other path (outside the package, or not verified)."""
        root = os.path.abspath(self.tree.package_dir)
        full = os.path.abspath(path)
        rel = os.path.relpath(full, root).replace(os.sep, "/") if full.startswith(root + os.sep) else None
        if rel is None or rel not in self.tree.digests:
            raise FileNotFoundError(f"{self.tree.label}: {path} is not among the build's verified files")
        return self._checked_bytes(rel)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        module.__file__ = str(self.path)  # kernels may find their own data files; there is no __cached__
        code = compile(self._source_bytes(), str(self.path), "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def get_source(self, fullname: str) -> str:
        """For tracebacks and inspect: the same verified text that ran."""
        return importlib.util.decode_source(self._source_bytes())


class _VerifiedFinder(importlib.abc.MetaPathFinder):
    """Finds every module under a registered kernel root name among that build's verified .py files only."""

    def __init__(self) -> None:
        self.trees: dict[str, _Tree] = {}

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        root, _, rest = fullname.partition(".")
        tree = self.trees.get(root)
        if tree is None:
            return None
        if not rest:
            rel, package = tree.entry, True
        else:
            stem = rest.replace(".", "/")
            if f"{stem}/__init__.py" in tree.digests:
                rel, package = f"{stem}/__init__.py", True
            elif f"{stem}.py" in tree.digests:
                rel, package = f"{stem}.py", False
            else:  # nothing else may run: not a .pyc, not a native module, not a file added later
                raise ModuleNotFoundError(f"No module named {fullname!r} among the verified files of {tree.label}",
                                          name=fullname)
        loader = _VerifiedLoader(tree, rel)
        spec = importlib.util.spec_from_loader(fullname, loader, origin=str(loader.path), is_package=package)
        assert spec is not None
        # has_location stays False: Python would derive a __pycache__ path (__cached__) from a located spec.
        if package:
            spec.submodule_search_locations = [str(loader.path.parent)]
        return spec


_finder = _VerifiedFinder()


def _install_finder() -> None:
    """Keep our finder first, so no other finder answers for a kernel's names."""
    if sys.meta_path and sys.meta_path[0] is _finder:
        return
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    sys.meta_path.insert(0, _finder)


def read_sources(package_dir: Path, digests: dict[str, str], label: str) -> dict[str, bytes]:
    """Every .py file among `digests`, read once and checked against its sha256 (IntegrityError where one changed
    since verify_tree; OSError where one vanished)."""
    out = {}
    for rel, digest in digests.items():
        if rel.endswith(".py"):
            data = package_dir.joinpath(*rel.split("/")).read_bytes()
            if sha256_bytes(data) != digest:
                raise IntegrityError(f"{label}: file {rel} changed while it was being verified")
            out[rel] = data
    return out


def survive_prune(first: Callable[[], T], again: Callable[[], T], what: str) -> T:
    """`first()`, or where the cache changed under it (a file vanished: another process pruning the cache) `again()`,
    the same step from a fresh fetch; a second vanishing, or any other raw OSError, is one KernelHubError."""
    try:
        return first()
    except (OSError, VanishedError):
        pass
    try:
        return again()
    except VanishedError:
        raise
    except OSError as exc:
        raise KernelHubError(f"{what}: {exc.filename or 'a cached file'}: {exc.strerror or exc} while loading "
                             "(another process may be pruning the cache); load it again") from None


def module_name(build: Build) -> str:
    """A name no other (folder, commit, variant) shares and no real package uses."""
    package = re.sub(r"\W", "_", build.package_dir.name)
    variant = re.sub(r"\W", "_", build.variant.name)
    where = hashlib.sha256(str(build.package_dir).encode()).hexdigest()[:8]
    return f"_kernel_hub_{package}_{build.commit[:16]}_{variant}_{where}"


def _forget(name: str) -> None:
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]
    _finder.trees.pop(name, None)


def import_build(build: Build) -> ModuleType:
    """Verify every digest of `build`, then import its variant entry as the package root.

    The entry file (e.g. torch_api.py for torch builds) is executed as the package's __init__ with the
    package folder as its search path, so its relative imports resolve exactly as in a published build.
    Whatever the import raises (SystemExit included; KeyboardInterrupt excepted) becomes one
    KernelImportError, with nothing of the kernel left in sys.modules.
    """
    check_variant_name(build.variant.name)
    key = (str(build.package_dir), build.commit, build.variant.name)
    label = f"{build.repo_id}@{(build.version or build.commit[:12])} [{build.variant.name}]"
    loadable, why = minver_decision(build.kernels_minver)
    if not loadable:
        raise KernelImportError(f"{label}: not loaded: {why}")
    with _lock:
        if key in _loaded:
            return _loaded[key]
        digests = check_digests(build.digests, label)
        try:
            verify_tree(build.package_dir, digests, label)
            sources = read_sources(Path(build.package_dir), digests, label)
        except OSError as exc:
            raise VanishedError(f"{label}: {exc.filename or build.package_dir} vanished while it was being "
                                f"verified ({exc.strerror or exc}): another process may be pruning the cache; "
                                "load it again") from None
        entry = check_entry_file(build.variant.entry, f"{label}: entry")
        if entry not in digests:
            raise KernelImportError(f"{label}: entry file {entry} is missing")
        name = module_name(build)
        _forget(name)
        _finder.trees[name] = _Tree(Path(build.package_dir), digests, entry, label, sources)
        _install_finder()
        try:
            module = importlib.import_module(name)
        except KeyboardInterrupt:
            _forget(name)
            raise
        except IntegrityError:
            _forget(name)
            raise
        except BaseException as exc:  # a kernel's SystemExit must not end the caller's process
            _forget(name)
            detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            raise KernelImportError(f"{label}: import failed: {type(exc).__name__}: {detail}".rstrip(": ")
                                    ) from (exc if isinstance(exc, Exception) else None)
        from ..verify.contract import fill_defaults
        from .framework_guard import guard_jax_exports

        fill_defaults(module)  # a kernel with one implementation needs no dispatch table
        if build.variant.framework == "jax":
            guard_jax_exports(module, label, build.repo_id)  # torch tensors: name the torch build instead
        module.__kernel_hub__ = KernelInfo(  # type: ignore[attr-defined]
            repo_id=build.repo_id,
            version=build.version,
            commit=build.commit,
            variant=build.variant.name,
            framework=build.variant.framework,
            backend=build.variant.backend,
            source=build.source,
            path=Path(build.package_dir),
            verified=build.verified,
            kernels_minver=build.kernels_minver,
        )
        _loaded[key] = module
        return module


def verified_digests(module: ModuleType) -> dict[str, str] | None:
    """The digests a kernel module from import_build was verified against (None for any other module): what a
    subprocess that imports the same build (the TPU compile worker) must check it against again."""
    tree = _finder.trees.get(module.__name__)
    return dict(tree.digests) if tree is not None else None
