"""symbols.json: what a torch-facing build exports, in HF kernels' schema (version 1), so `kernels describe-api
<repo>` lists a release's functions and layer classes without importing it.

Read from the package's source with `ast`: nothing of the kernel is imported or run at publish time (a kernel
folder is untrusted input, and the torch-tpu entry registers ops when imported). The rules, since source is not a
running module:
  functions  the entry's `__all__` (followed through `[*module.__all__, ...]`, relative `from .x import name` and
             `from .x import *`): a name bound by `def` (with its parameters and the first line of its docstring),
             or a lowercase name bound by assignment (a callable made by a factory, e.g. a dispatch's exports:
             signature unknown, null). Modules, classes and ALL_CAPS constants are not functions.
  layers     classes of the package's `layers.py` that HF kernels accepts as a layer (no constructor of their
             own), each with its `has_backward` / `can_torch_compile` when written as a literal bool (null where
             not). A `<Name>Layout` companion (transformers' MoE layout class, with a constructor) is not a layer.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import MetadataError

SYMBOLS_FILE = "symbols.json"
SCHEMA_VERSION = 1
LAYERS_MODULE = "layers.py"
_FLAGS = ("has_backward", "can_torch_compile")


class _Package:
    """The package's source files, parsed on demand (relative path inside the package -> module AST)."""

    def __init__(self, files: Mapping[str, Path], entry: str):
        self.files = files
        self.entry = entry
        self._trees: dict[str, ast.Module] = {}

    def tree(self, rel: str) -> ast.Module:
        if rel not in self._trees:
            try:
                self._trees[rel] = ast.parse(self.files[rel].read_bytes(), filename=rel)
            except SyntaxError as exc:
                raise MetadataError(f"{rel}: not valid Python ({exc.msg}, line {exc.lineno}); cannot list its "
                                    "symbols") from None
            except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, nesting too deep to parse
                raise MetadataError(f"{rel}: cannot be parsed ({type(exc).__name__}); cannot list its symbols"
                                    ) from None
        return self._trees[rel]

    def module_file(self, importer: str, level: int, module: str | None) -> str | None:
        """The package file a relative import names (`from .x import ...` in `importer`), or None (outside)."""
        if level < 1:
            return None
        base = importer.split("/")[:-1]
        if level - 1 > len(base):
            return None
        base = base[:len(base) - (level - 1)]
        parts = base + (module.split(".") if module else [])
        for candidate in ("/".join(parts) + ".py", "/".join([*parts, "__init__.py"])):
            if candidate in self.files:
                return candidate
        return None


def _literal_all(pkg: _Package, rel: str, seen: frozenset[str] = frozenset()) -> list[str]:
    """The module's `__all__`: string literals and `*other.__all__` of a relatively imported module."""
    if rel in seen:
        return []
    tree = pkg.tree(rel)
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                and isinstance(node.value, ast.List | ast.Tuple)):
            names: list[str] = []
            for elt in node.value.elts:
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    names.append(elt.value)
                elif (isinstance(elt, ast.Starred) and isinstance(elt.value, ast.Attribute)
                      and elt.value.attr == "__all__" and isinstance(elt.value.value, ast.Name)):
                    other = _imported_module(pkg, rel, elt.value.value.id)
                    if other is not None:
                        names += _literal_all(pkg, other, seen | {rel})
            return names
    return []


def _imported_module(pkg: _Package, rel: str, name: str) -> str | None:
    """The package file bound to `name` by `from . import name` / `from .x import name` in `rel`."""
    for node in pkg.tree(rel).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    sub = f"{node.module}.{alias.name}" if node.module else alias.name
                    return pkg.module_file(rel, node.level, sub)
    return None


def _binding(pkg: _Package, rel: str, name: str, depth: int = 0) -> tuple[str, Any] | None:
    """What binds `name` in module `rel`: ("def", node), ("class", node), ("module", None), ("assign", None), or
    None where nothing in the package does (an outside import)."""
    if depth > 16:
        return None
    stars = []
    found: tuple[str, Any] | None = None
    for node in pkg.tree(rel).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            found = ("def", node)
        elif isinstance(node, ast.ClassDef) and node.name == name:
            found = ("class", node)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            if name in names:
                found = ("assign", None)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    stars.append(node)
                elif (alias.asname or alias.name) == name:
                    sub = pkg.module_file(rel, node.level, f"{node.module}.{alias.name}" if node.module else alias.name)
                    if sub is not None:
                        found = ("module", None)
                        continue
                    src = pkg.module_file(rel, node.level, node.module)
                    found = _binding(pkg, src, alias.name, depth + 1) if src is not None else None
    if found is not None:
        return found
    for node in stars:
        src = pkg.module_file(rel, node.level, node.module)
        if src is not None and (hit := _binding(pkg, src, name, depth + 1)) is not None:
            return hit
    return None


def _function(name: str, node: ast.FunctionDef | ast.AsyncFunctionDef | None) -> dict[str, Any]:
    if node is None:
        return {"name": name, "signature": None, "doc": None}
    doc = ast.get_docstring(node)
    try:
        signature: str | None = f"({ast.unparse(node.args)})"
    except (RecursionError, ValueError):  # defaults nested too deep to write back: the name alone
        signature = None
    return {"name": name, "signature": signature,
            "doc": doc.strip().splitlines()[0] if doc else None}


def _flag(node: ast.ClassDef, flag: str) -> bool | None:
    for stmt in node.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
            stmt, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == flag for t in targets):
            value = stmt.value
            return value.value if isinstance(value, ast.Constant) and isinstance(value.value, bool) else None
    return None


def _layers(pkg: _Package) -> list[dict[str, Any]]:
    if LAYERS_MODULE not in pkg.files:
        return []
    out = []
    for node in pkg.tree(LAYERS_MODULE).body:
        if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
            continue
        if any(isinstance(s, ast.FunctionDef) and s.name == "__init__" for s in node.body):
            continue  # a constructor: HF kernels refuses it as a layer (a Layout companion, say)
        if not any(isinstance(s, ast.FunctionDef) and s.name == "forward" for s in node.body):
            continue  # no forward: an exception or a helper, not a layer
        out.append({"name": node.name, "attributes": {f: _flag(node, f) for f in _FLAGS}})
    return out


def build_symbols(files: Mapping[str, Path], entry: str) -> dict[str, Any]:
    """symbols.json of a build whose package holds `files` (path inside the package -> source file) and whose
    `__init__` is `entry`'s content."""
    if entry not in files:
        raise MetadataError(f"entry {entry} is not among the package's files")
    pkg = _Package(files, entry)
    functions = []
    for name in sorted(set(_literal_all(pkg, entry))):
        bound = _binding(pkg, entry, name)
        if bound is None:
            continue
        kind, node = bound
        if kind == "def":
            functions.append(_function(name, node))
        elif kind == "assign" and name == name.lower():
            functions.append(_function(name, None))
    return {"schema_version": SCHEMA_VERSION, "functions": functions, "layers": _layers(pkg)}
