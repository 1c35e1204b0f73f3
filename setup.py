"""Build hook: embed the catalogue and the kernel sources into the wheel.

Everything else about the package lives in pyproject.toml. A wheel must work outside the checkout, so at
build time this copies the repository's `registry.yaml` and the whole of `kernels/pallas/` (every folder
there, `_common/` included, minus each folder's `tests/`, caches and bytecode; symlinks become the files
they point at) into `kernel_hub/_embedded/` inside the wheel. The registry's `source:` paths are relative
to registry.yaml, so they resolve the same inside the package as in the checkout. The benchmarks (`bench/`)
are checkout tools and do not ship. An editable install (`pip install -e .`) embeds nothing: it reads the
checkout's own files (kernel_hub.load.registry.registry_location).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
EMBEDDED = Path("kernel_hub", "_embedded")  # inside the package; kernel_hub.load.registry.registry_location reads it
KERNELS = Path("kernels", "pallas")


def _skip(folder: str, names: list[str]) -> set[str]:
    """What copytree leaves out: caches, bytecode, dotfiles, a kernel folder's own tests/ and the kernel tests'
    conftest.py (test set-up, not a kernel)."""
    rel = Path(folder).relative_to(ROOT / KERNELS)
    skipped = {n for n in names if n == "__pycache__" or n.startswith(".") or n.endswith((".pyc", ".pyo"))}
    if not rel.parts and "conftest.py" in names:  # kernels/pallas/conftest.py
        skipped.add("conftest.py")
    if len(rel.parts) == 1 and "tests" in names:  # kernels/pallas/<kernel>/tests
        skipped.add("tests")
    return skipped


def embed(target: Path) -> list[Path]:
    """Copy registry.yaml and kernels/pallas/ under `target` (replacing what a previous build left there)."""
    registry, kernels = ROOT / "registry.yaml", ROOT / KERNELS
    if not registry.is_file() or not kernels.is_dir():
        raise RuntimeError(f"cannot embed the registry: {registry} or {kernels} is missing (build from a checkout "
                           "or from an sdist made by it)")
    if target.exists():
        shutil.rmtree(target)  # a stale file from an earlier build must not reach the wheel
    target.mkdir(parents=True)
    shutil.copyfile(registry, target / "registry.yaml")
    shutil.copytree(kernels, target / KERNELS, symlinks=False, ignore=_skip)  # symlinks=False: copy the content
    return sorted(p for p in target.rglob("*") if p.is_file())


class BuildPyWithEmbedded(build_py):
    """setuptools' build_py, plus the embedded registry and kernels for a regular (non-editable) build."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self._embedded = embed(Path(self.build_lib) / EMBEDDED)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), *map(str, getattr(self, "_embedded", []))]


setup(cmdclass={"build_py": BuildPyWithEmbedded})
