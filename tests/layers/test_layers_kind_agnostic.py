"""The generic jobs of layers/ (find, load, plan, layer_check, swap, report, the weights guard, ...) know no kind:
everything one kind needs lives in its folder under layers/kinds/, so a new kind is a new folder and nothing else.

Read from the source with ast: every identifier a module outside kinds/ defines, reads, imports or passes as a
keyword. None may: a kind's public names, its HF layer names (`hf_names`, `hf_pattern`) and its check of
`quantize=` (`quantizes`) are declared in its own folder.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

LAYERS = Path(__file__).resolve().parents[2] / "src" / "kernel_hub" / "layers"
KIND_WORD = re.compile(r"expert|attention|attn|rms", re.IGNORECASE)


def _identifiers(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.update(n for n in (node.name, node.asname) if n)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
    return names


def _kind_names(path: Path) -> set[str]:
    return {n for n in _identifiers(ast.parse(path.read_text())) if KIND_WORD.search(n)}


@pytest.mark.parametrize("path", sorted(LAYERS.glob("*.py")), ids=lambda p: p.name)
def test_generic_layer_modules_name_no_kind(path: Path) -> None:
    assert not _kind_names(path), f"{path.name} names a kind: move it into layers/kinds/"


def test_the_scan_sees_a_kind_name_wherever_it_is_written(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("from .kinds.experts import x as y\nHOOK = 1\ndef f(attn_mask): return g(rms=1).Experts\n")
    assert _kind_names(source) == {"kinds.experts", "attn_mask", "rms", "Experts"}
    assert len(list(LAYERS.glob("*.py"))) > 10  # the scan reads the generic modules where they are
