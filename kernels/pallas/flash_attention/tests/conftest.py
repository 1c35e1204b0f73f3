"""Put the kernel's folder on sys.path so `import flash_attention` loads this package, as a published
repo would be loaded, without kernel_hub; and this folder, for the shared `fa_helpers`."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (str(HERE.parent), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)
