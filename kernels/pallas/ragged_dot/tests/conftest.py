"""Put the kernel folder on sys.path so `import ragged_dot` loads this package (as the Hub build would),
and this folder so the tests share `ragged_dot_testutil` (pytest runs with --import-mode=importlib)."""

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _path in (str(_HERE.parent), str(_HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
