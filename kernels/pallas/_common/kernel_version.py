"""The release version of the package this file is vendored into, read from its kernel.yaml.

kernel.yaml is the one place a kernel's version is written. Assembly (kernel_hub.package.vendoring) copies it into the
package as `<python_name>/kernel.yaml`, so a built package finds it beside its own files wherever it runs. A built
package runs without kernel_hub and may lack PyYAML, so this reads the one top-level `version:` line itself;
kernel_hub checked the whole file when it assembled the package (the version is X.Y.Z).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

METADATA_FILE = "kernel.yaml"
_VERSION_LINE = re.compile(r"""version:[ \t]*(["']?)(\d+\.\d+\.\d+)\1[ \t]*(?:#.*)?""")


def kernel_version(package_dir: str | Path, loader: Any = None) -> str:
    """`version` in `package_dir`/kernel.yaml; ValueError unless exactly one top-level `version: X.Y.Z` line. Pass
    the package's `__spec__.loader`: kernel-hub's verified loader checks the file's bytes against the build's digests
    as it hands them over (the read the native C sources use too); a plain import's loader reads the file as is."""
    path = Path(package_dir) / METADATA_FILE
    get_data = getattr(loader, "get_data", None)
    text = get_data(str(path)).decode("utf-8") if get_data is not None else path.read_text(encoding="utf-8")
    found = [m.group(2) for line in text.splitlines()
             if (m := _VERSION_LINE.fullmatch(line.rstrip()))]
    if len(found) != 1:
        raise ValueError(f"{path}: expected one top-level line `version: X.Y.Z`, found {len(found)}")
    return found[0]
