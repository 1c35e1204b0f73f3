"""This package's release version: kernel.yaml's `version`, the one place it is written (assembly copies kernel.yaml
into the package; _vendor/kernel_version.py reads it there).

It names the torch ops the torch-tpu build registers (kernel_hub_<kernel>_v<X>_<Y>_<Z>::<entry>), so two versions
loaded in one process register two ops.
"""

from pathlib import Path

from ._vendor.kernel_version import kernel_version

VERSION = kernel_version(Path(__file__).parent, __spec__.loader if __spec__ is not None else None)
