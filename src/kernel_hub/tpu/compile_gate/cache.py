"""Compile results on disk, one file per (package content, variant, jax, libtpu, generation); the content key is a
40-hex digest of the package's files (gate.content_key), so a re-publish of unchanged kernel code compiles nothing.

The compiler is deterministic for those five, so a case compiled once (passed or refused) is not compiled
again. The file is untrusted on read: anything malformed is a miss, and writes are atomic.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ...decide.system import TPU_COMPILE_PART
from ...decide.system import cache_root as system_cache_root
from ...names import check_commit, check_variant_name
from ...package.compile_record import VERSION_PATTERN

if TYPE_CHECKING:
    from ...json_types import JsonDict, JsonValue

_FIELDS = {"passed": bool, "error": (str, type(None)), "compile_seconds": (int, float, type(None))}


def cache_root() -> Path:
    """TPU compile results, beside kernel-hub's other caches (system.cache_root)."""
    return system_cache_root(TPU_COMPILE_PART)


def entry_path(commit: str, variant: str, jax_version: str, libtpu_version: str, generation: str,
               root: Path | None = None) -> Path:
    """The cache file for one key; every part is checked before it becomes a file name."""
    check_commit(commit)
    check_variant_name(variant)
    for label, value in (("jax version", jax_version), ("libtpu version", libtpu_version),
                         ("generation", generation)):
        if not VERSION_PATTERN.match(value):
            raise ValueError(f"unsafe {label} {value!r} for a cache file name")
    name = f"{commit}_{variant}_jax{jax_version}_libtpu{libtpu_version}_{generation}.json"
    return (root or cache_root()) / name


def _valid(record: JsonValue) -> bool:
    return isinstance(record, dict) and all(isinstance(record.get(k), t) for k, t in _FIELDS.items())


def load(path: Path) -> tuple[dict[str, JsonDict], dict[str, list[str]]]:
    """(case name -> result record, selection -> case names); empty when missing or malformed."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, {}
    if not isinstance(data, dict):
        return {}, {}
    cases, selections = data.get("cases"), data.get("selections")
    cases = {k: v for k, v in cases.items() if isinstance(k, str) and _valid(v)} if isinstance(cases, dict) else {}
    selections = {
        k: v for k, v in selections.items() if isinstance(v, list) and all(isinstance(n, str) for n in v)
    } if isinstance(selections, dict) else {}
    return cases, selections


def store(path: Path, records: dict[str, JsonDict], selections: dict[str, list[str]] | None = None) -> None:
    """Merge `records` (and the case lists of `selections`) into the file (atomic replace)."""
    old_cases, old_selections = load(path)
    data = {"cases": {**old_cases, **records}, "selections": {**old_selections, **(selections or {})}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
