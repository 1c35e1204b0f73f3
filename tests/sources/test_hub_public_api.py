"""kernel-hub reaches huggingface_hub through its public API only: no private module (`huggingface_hub.utils._http`),
no private name imported from it, and no private attribute of its objects (`HfApi()._build_hf_headers()`). Static
(ast): a private attribute is one huggingface_hub defines under a `_name` and src/ does not define itself."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import huggingface_hub

SRC = Path(__file__).resolve().parents[2] / "src" / "kernel_hub"
HUB = Path(huggingface_hub.__file__).resolve().parent


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined(tree: ast.AST) -> set[str]:
    """Names a module defines: functions, classes, assigned names and attributes, parameters."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


@functools.cache
def _hub_private_names() -> frozenset[str]:
    names: set[str] = set()
    for path in HUB.rglob("*.py"):
        names |= {n for n in _defined(ast.parse(path.read_text(encoding="utf-8"))) if _private(n)}
    return frozenset(names)


def private_hub_uses(text: str, ours: set[str]) -> list[str]:
    """Each use of a huggingface_hub private module, import or attribute in one module's source (line: what)."""
    found = []
    private = _hub_private_names() - ours
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "huggingface_hub":
            parts = node.module.split(".") + [a.name for a in node.names]
            found += [f"{node.lineno}: from {node.module} import {p}" for p in parts if _private(p)]
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "huggingface_hub" and any(map(_private, a.name.split(".")))]
        elif isinstance(node, ast.Attribute) and node.attr in private:
            found.append(f"{node.lineno}: .{node.attr}")
    return found


def test_the_check_sees_each_kind_of_private_use() -> None:
    assert private_hub_uses("from huggingface_hub.utils import _http\n", set())
    assert private_hub_uses("import huggingface_hub.utils._http\n", set())
    assert private_hub_uses("def f(api):\n    return api._build_hf_headers()\n", set())
    assert private_hub_uses("from huggingface_hub.utils import build_hf_headers, get_session\n", set()) == []
    assert private_hub_uses("def f(api):\n    return api._build_hf_headers()\n", {"_build_hf_headers"}) == []


def test_src_uses_no_private_huggingface_hub_name() -> None:
    trees = {path: ast.parse(path.read_text()) for path in SRC.rglob("*.py")}
    ours = set().union(*(_defined(tree) for tree in trees.values()))
    found = [f"{path.relative_to(SRC)}:{use}" for path in trees for use in private_hub_uses(path.read_text(), ours)]
    assert found == []


def test_the_bounded_client_replaces_only_huggingface_hubs_default() -> None:
    """install_client_timeout swaps in the bounded client for huggingface_hub's default (no timeout), keeping its
    request hooks (offline mode, request ids), and leaves a client the user configured as it is."""
    import httpx2
    from huggingface_hub.utils import _http, get_session, set_client_factory

    from kernel_hub.sources.http_limits import request_timeout
    from kernel_hub.sources.hub.client import install_client_timeout

    saved = _http._GLOBAL_CLIENT_FACTORY
    try:
        set_client_factory(_http.default_client_factory)
        install_client_timeout()
        ours = get_session()
        assert ours.timeout == httpx2.Timeout(request_timeout())
        assert ours.event_hooks["request"] == [_http.hf_request_event_hook]
        set_client_factory(lambda: httpx2.Client(timeout=7.0))
        install_client_timeout()
        assert get_session().timeout == httpx2.Timeout(7.0)
    finally:
        set_client_factory(saved)
