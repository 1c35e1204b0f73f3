"""Put the kernel folder on sys.path so `import tokamax_ragged_dot` loads this package as a published repo
would be loaded, without kernel_hub (pytest runs with --import-mode=importlib)."""

import sys
from pathlib import Path

_KERNEL_DIR = str(Path(__file__).resolve().parent.parent)
if _KERNEL_DIR not in sys.path:
    sys.path.insert(0, _KERNEL_DIR)
