"""Kernel tests import each kernel package the way its published build holds it: the package's own files plus
the shared `_common/` files its kernel.yaml vendors, assembled (as plain files, by package.vendoring, the same
code LocalSource and `kernel-hub publish` use) into one temp folder per test session that goes first on sys.path.
So `import ragged_dot` in a kernel test loads `<tmp>/ragged_dot/` with its `_vendor/`, never the source folder.
Each kernel's tests/ folder goes on sys.path too, for its test helpers (pytest runs with --import-mode=importlib).
The assembled copy is taken at session start: edit, then rerun.

Each kernel test module compiles with XLA's CPU backend optimisation off (jax_disable_most_optimizations, in this
process only: a subprocess, a TPU compile through libtpu included, keeps the defaults). The tests compare interpreted
Pallas kernels with references on small arrays, so compiling the interpreted kernel's large program is most of their
time and LLVM's optimisation of it roughly half of that; the numbers checked do not depend on it.
"""

import atexit
import shutil
import sys
import tempfile
from pathlib import Path

import jax
import pytest

from kernel_hub.package.vendoring import assemble

_PALLAS = Path(__file__).resolve().parent
_ASSEMBLED = Path(tempfile.mkdtemp(prefix="kh-kernel-packages-"))
atexit.register(shutil.rmtree, _ASSEMBLED, True)

for _kernel_dir in sorted(p.parent for p in _PALLAS.glob("*/kernel.yaml")):
    assemble(_kernel_dir, _ASSEMBLED)
    if (_kernel_dir / "tests").is_dir():
        sys.path.insert(0, str(_kernel_dir / "tests"))
sys.path.insert(0, str(_ASSEMBLED))


@pytest.fixture(scope="module", autouse=True)
def _unoptimised_cpu_compiles():
    """XLA CPU compiles without backend optimisation for this module, then the setting it found."""
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", before)
