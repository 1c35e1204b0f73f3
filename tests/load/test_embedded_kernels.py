"""The embedded registry's own kernels: load by every kind of spec, offline, and pass the harness here."""

from __future__ import annotations

import numpy as np
import pytest

import kernel_hub as kh
from kernel_hub.load.registry import load_registry

RAGGED = "kernel-hub/ragged-dot-tpu"


def test_registry_lists_five_kernels_with_sources():
    entries = load_registry().entries
    assert {e.repo_id for e in entries} == {
        RAGGED, "kernel-hub/flash-attention-tpu", "kernel-hub/tokamax-ragged-dot", "kernel-hub/tokamax-attention",
        "kernel-hub/rms-norm-tpu"}
    assert all(e.source is not None and (e.source / "kernel.yaml").is_file() for e in entries)


def test_ragged_dot_by_default_spec_major_and_range_is_one_module():
    default, major, ranged = (kh.get_kernel(RAGGED, **kw) for kw in ({}, {"version": 1}, {"version": ">=1.0,<2"}))
    assert default is major is ranged
    assert default.__kernel_hub__.variant == "jax-cpu" and kh.has_kernel(RAGGED, version=1)
    rng = np.random.default_rng()
    lhs = rng.standard_normal((37, 24)).astype(np.float32)
    rhs = rng.standard_normal((5, 24, 16)).astype(np.float32)
    sizes = np.array([9, 0, 20, 0, 3], np.int32)  # 32 of 37 rows grouped: the last 5 must be zero
    out = np.asarray(default.ragged_dot(lhs, rhs, sizes), np.float64)
    expected = np.zeros((37, 16))
    start = 0
    for g, n in enumerate(sizes):
        expected[start:start + n] = lhs[start:start + n].astype(np.float64) @ rhs[g]
        start += n
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert not out[32:].any()


def test_local_path_and_registry_give_the_same_commit():
    path = load_registry().require(RAGGED).source
    assert kh.get_local_kernel(path).__kernel_hub__.commit == kh.get_kernel(RAGGED).__kernel_hub__.commit


@pytest.mark.parametrize("repo", ["kernel-hub/flash-attention-tpu"])
def test_flash_attention_passes_the_harness_on_cpu(repo):
    report = kh.validate(kh.get_kernel(repo))
    assert report.passed, str(report)
    assert {"decode", "prefill"} <= {t for c in report.cases for t in c.tags}
    assert any(c.implementation == "pallas" for c in report.cases)


def test_kernel_packages_never_import_kernel_hub_and_use_relative_imports_only():
    """A published kernel must load where only its frameworks are installed (DESIGN: rules of the house)."""
    import ast

    offenders = []
    for entry in load_registry().entries:
        meta_pkg = next(p for p in entry.source.iterdir() if p.is_dir() and (p / "__init__.py").is_file()
                        and p.name != "tests")
        own = {meta_pkg.name, *(d.name for d in meta_pkg.iterdir() if d.is_dir())}
        for path in meta_pkg.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                offenders += [f"{path}: {n}" for n in names if n.split(".")[0] in {"kernel_hub", *own}]
    assert offenders == []
