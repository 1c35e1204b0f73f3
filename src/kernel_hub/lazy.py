"""Names a package serves on first use: `import kernel_hub` (and `kernel_hub.layers`) stays light, and jax, torch
and transformers load only when a name that needs them is read. One helper for every package that does this."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, table: dict[str, str],
               namespace: dict[str, object]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(__getattr__, __dir__) for `package`: `table` maps each public name to the submodule (relative to `package`)
    that defines it; a name is imported on its first read and kept in `namespace` (the package's globals()), so later
    reads cost nothing. An unknown name is AttributeError, as for any module."""

    def getattr_(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(table))

    return getattr_, dir_
