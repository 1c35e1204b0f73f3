"""The release version of the package this file is vendored into, read from its kernel.yaml.

kernel.yaml is the one place a kernel's version is written. Assembly (kernel_hub.vendoring) copies it into the
package as `<python_name>/kernel.yaml`, so a built package finds it beside its own files wherever it runs. A built
package runs without kernel_hub and may lack PyYAML, so this reads the one top-level `version:` line itself;
kernel_hub checked the whole file when it assembled the package (the version is X.Y.Z).
"""

from __future__ import annotations

import re
from pathlib import Path

METADATA_FILE = "kernel.yaml"
_VERSION_LINE = re.compile(r"""version:[ \t]*(["']?)(\d+\.\d+\.\d+)\1[ \t]*(?:#.*)?""")


def kernel_version(package_dir: str | Path) -> str:
    """`version` in `package_dir`/kernel.yaml; ValueError unless exactly one top-level `version: X.Y.Z` line."""
    path = Path(package_dir) / METADATA_FILE
    found = [m.group(2) for line in path.read_text(encoding="utf-8").splitlines()
             if (m := _VERSION_LINE.fullmatch(line.rstrip()))]
    if len(found) != 1:
        raise ValueError(f"{path}: expected one top-level line `version: X.Y.Z`, found {len(found)}")
    return found[0]
