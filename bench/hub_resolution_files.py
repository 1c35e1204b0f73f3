"""Which modules of kernel_hub a Hub resolution runs through: the files a change to how a Hub repo resolves touches.

Publishes the toy kernel (two versions) to `kernel-hub serve` in its own process, loads once to import what a
load imports, then profiles (sys.setprofile) one fresh `plan_load(repo, version=1)` into an empty cache (refs ->
versions.resolve -> candidate variants -> fetch of the chosen build) and one `HubSource.variants(repo, commit)` (the
build listing). Prints every kernel_hub module with a function called on that path, its folder and its size, then
the functions (defs, methods included) each defines and its largest class.

Runs against any checkout of the project, so a number before a change and after it come from one script:
    PYTHONPATH=src python bench/hub_resolution_files.py            # this tree
    cd OLD && PYTHONPATH=src python /path/to/bench/hub_resolution_files.py   # another one (git archive of a commit)
"""

from __future__ import annotations

import ast
import importlib
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kernel_hub

ROOT = Path.cwd()
PACKAGE = Path(kernel_hub.__file__).resolve().parent
REPO = "acme/toy-scale"
TOKEN = "bench-token"


def _first(*candidates: tuple[str, str]) -> Any:
    """The first (module, name) this checkout has: module paths differ between versions of the layout."""
    for module, name in candidates:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise SystemExit(f"none of {candidates} here")


def _traced(run: Callable[[], Any]) -> tuple[Any, set[Path]]:
    seen: set[Path] = set()

    def tracer(frame: Any, event: str, arg: Any) -> None:
        path = Path(frame.f_code.co_filename)
        if event == "call" and path.is_relative_to(PACKAGE):
            seen.add(path)

    sys.setprofile(tracer)
    threading.setprofile(tracer)
    try:
        result = run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return result, seen


def _classes_and_functions(path: Path) -> tuple[list[tuple[str, int]], int]:
    tree = ast.parse(path.read_text())
    classes = [(n.name, (n.end_lineno or n.lineno) - n.lineno + 1) for n in ast.walk(tree)
               if isinstance(n, ast.ClassDef)]
    functions = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree))
    return classes, functions


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from tests.hub_server import running_server

    hub_source = _first(("kernel_hub.sources.hub.source", "HubSource"), ("kernel_hub.hub", "HubSource"))
    publish = _first(("kernel_hub.publish.release", "publish"), ("kernel_hub.publish", "publish"))
    plan_load = _first(("kernel_hub.api", "plan_load"))
    toy = ROOT / "tests" / "fixtures" / "toy_kernel"
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp) / "store", token=TOKEN) as srv:
        for version in ("1.2.0", "1.3.0"):
            folder = Path(tmp) / version
            shutil.copytree(toy, folder, ignore=shutil.ignore_patterns("__pycache__"))
            meta = folder / "kernel.yaml"
            meta.write_text(meta.read_text().replace("version: 1.2.0", f"version: {version}"))
            publish(folder, repo_id=REPO, endpoint=srv.url, token=TOKEN, skip_validation=True,
                    skip_tpu_compile=True, log=lambda _: None)
        warm = hub_source(endpoint=srv.url, cache_dir=Path(tmp) / "warm")
        plan_load(REPO, version=1, source=warm, framework="jax", backend="cpu")
        warm.variants(REPO, warm.refs(REPO)[0].commit)
        source = hub_source(endpoint=srv.url, cache_dir=Path(tmp) / "cache")
        plan, seen = _traced(lambda: plan_load(REPO, version=1, source=source, framework="jax", backend="cpu"))
        _, listed = _traced(lambda: source.variants(REPO, plan.resolution.commit))
    files = sorted(seen | listed)
    print(f"{len(files)} modules on the path (plan_load(version=1) + variants), {len(seen)} in plan_load alone")
    print(f"  {'folder':<14} {'module':<22} {'lines':>5} {'defs':>5}  largest class")
    for path in files:
        rel = path.relative_to(PACKAGE)
        classes, functions = _classes_and_functions(path)
        big = max(classes, key=lambda c: c[1], default=None)
        print(f"  {str(rel.parent) if rel.parent != Path('.') else '.':<14} {rel.name:<22} "
              f"{len(path.read_text().splitlines()):>5} {functions:>5}  {f'{big[0]} ({big[1]})' if big else '-'}")
    largest = max(((c, n, p) for p in files for c, n in _classes_and_functions(p)[0]), key=lambda t: t[1])
    print(f"largest class on the path: {largest[0]}, {largest[1]} lines ({largest[2].relative_to(PACKAGE)})")

if __name__ == "__main__":
    main()
