"""The import graph of src/kernel_hub stays a layering: no cycle of modules across folders (kernel_hub/,
tpu/, cli/, server/, layers/, ...), counting imports inside functions too (an import hidden in a function to
dodge a cycle is still a cycle), and no cycle at all among module-level imports. Static (ast): nothing is
imported."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "kernel_hub"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    """The kernel_hub modules an import statement loads (a package's name when it names the package)."""
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            here = here[: len(here) - (node.level - 1)]
            base = ".".join([*here, *([node.module] if node.module else [])])
        wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    found = set()
    for target in wanted:
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in modules and target != name:
            found.add(target)
    return found


@functools.cache
def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, Path]]:
    """(module-level edges, all edges incl. imports inside functions, modules)."""
    modules = _modules()
    top: dict[str, set[str]] = {m: set() for m in modules}
    every: dict[str, set[str]] = {m: set() for m in modules}

    def walk(name: str, path: Path, node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found = _targets(name, path, child, modules)
                every[name] |= found
                if not in_function:
                    top[name] |= found
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            walk(name, path, child, inner)

    for name, path in modules.items():
        walk(name, path, ast.parse(path.read_text()), False)
    return top, every, modules


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_cycle_across_folders() -> None:
    _, every, modules = _graph()
    across = [c for c in _cycles(every) if len({modules[m].parent for m in c}) > 1]
    assert across == [], f"import cycles across folders (imports inside functions included): {across}"


def test_no_cycle_among_module_level_imports() -> None:
    top, _, _ = _graph()
    assert _cycles(top) == []


@pytest.mark.parametrize(("folder", "forbidden"), [("validation.py", "tpu"), ("buildfmt.py", "tpu")])
def test_numbers_and_the_build_format_need_no_tpu(folder: str, forbidden: str) -> None:
    _, every, _ = _graph()
    name = "kernel_hub." + folder.removesuffix(".py")
    assert not {t for t in every[name] if t.startswith(f"kernel_hub.{forbidden}")}


def test_the_guard_sees_a_cycle() -> None:
    """The cycle finder itself: a two-module loop is found, a chain is not."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_only_the_hub_client_touches_its_internals() -> None:
    """publish and the CLI reach the Hub through HubSource's public methods: no `x._call(...)` outside hub.py."""
    found = [f"{path.relative_to(SRC)}:{node.lineno}" for path in PACKAGE.rglob("*.py") if path.name != "hub.py"
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "_call"]
    assert found == []


def test_no_cycle_inside_layers() -> None:
    """layers/ is built in layers (kinds on top of the adapters and the jobs: find, plan, load, validate, swap,
    report): no cycle among its modules, counting imports inside functions too."""
    _, every, _ = _graph()
    inside = {m: {t for t in targets if t.startswith("kernel_hub.layers")}
              for m, targets in every.items() if m.startswith("kernel_hub.layers")}
    assert _cycles(inside) == [], "import cycles inside layers/ (imports inside functions included)"
