"""Kernel tests import each kernel package the way its published build holds it: the package's own files plus
the shared `_common/` files its kernel.yaml vendors, assembled (as plain files, by package.vendoring, the same
code LocalSource and `kernel-hub publish` use) into one temp folder per test session that goes first on sys.path.
So `import ragged_dot` in a kernel test loads `<tmp>/ragged_dot/` with its `_vendor/`, never the source folder.
Each kernel's tests/ folder goes on sys.path too, for its test helpers (pytest runs with --import-mode=importlib).
The assembled copy is taken at session start: edit, then rerun.
"""

import atexit
import shutil
import sys
import tempfile
from pathlib import Path

from kernel_hub.package.vendoring import assemble

_PALLAS = Path(__file__).resolve().parent
_ASSEMBLED = Path(tempfile.mkdtemp(prefix="kh-kernel-packages-"))
atexit.register(shutil.rmtree, _ASSEMBLED, True)

for _kernel_dir in sorted(p.parent for p in _PALLAS.glob("*/kernel.yaml")):
    assemble(_kernel_dir, _ASSEMBLED)
    if (_kernel_dir / "tests").is_dir():
        sys.path.insert(0, str(_kernel_dir / "tests"))
sys.path.insert(0, str(_ASSEMBLED))
