"""The TPU compile gate: the real TPU compiler (libtpu in .venv-tpu, driven in a subprocess) on every kernel.

Skips, with the reason, only where the TPU environment is missing (`make test` creates it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_hub.tpu.compile_gate import gate
from kernel_hub.tpu.compile_gate.worker_pool import compile_in_worker
from kernel_hub.tpu.env import TpuEnvironmentError, find_tpu_python
from kernel_hub.tpu.package import folder_package, local_package
from tests.tpu_toys import env_or_skip, write_package

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ("ragged_dot", "flash_attention", "tokamax_ragged_dot", "tokamax_attention")
#: What each smoke case compiles (the kernel contract's last_implementation()): the Tokamax attention wrapper is
#: called as a user calls it, and its decode mask is one Tokamax's Mosaic refuses, so XLA compiles there.
SMOKE_IMPLEMENTATIONS = {"ragged_dot": {"pallas"}, "flash_attention": {"pallas"}, "tokamax_ragged_dot": {"mosaic"},
                         "tokamax_attention": {"mosaic", "xla"}}


@pytest.fixture(scope="module")
def env():
    return env_or_skip()


@pytest.mark.parametrize("kernel", KERNELS)
def test_smoke_cases_compile_for_v5e_and_v6e(env, kernel, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path))
    package = folder_package(ROOT / "kernels/pallas" / kernel)
    report = gate.compile_matrix(package, ["v5e", "v6e"], tags=["smoke"], env=env)
    assert report.passed, str(report)
    assert report.backend == "tpu" and report.libtpu_version == env.libtpu_version
    assert {c.generation for c in report.cases} == {"v5e", "v6e"}
    assert any("fwd" in c.tags for c in report.cases) and any("bwd" in c.tags for c in report.cases)
    assert {c.implementation for c in report.cases} == SMOKE_IMPLEMENTATIONS[kernel]
    if kernel == "tokamax_attention":
        assert {c.name: c.implementation for c in report.cases if c.generation == "v5e"} == {
            "fwd:prefill:causal_gqa_d128:bf16": "mosaic", "bwd:prefill:causal_gqa_d128:bf16": "mosaic",
            "fwd:decode:decode_gqa_ragged_d64:bf16": "xla"}
    for case in report.cases:
        assert case.kind == "compile" and not case.cached
        assert case.compile_seconds > 0 and case.argument_bytes > 0 and case.output_bytes > 0
    record = gate.compile_record(report)
    assert record["passed"] and record["generations"] == ["v5e", "v6e"] and record["failed"] == []
    smoke = len({c.name for c in report.cases})
    assert record["cases"] == smoke and record["compiled"] == 2 * smoke
    assert sum(record["per_generation"]["v6e"]["implementations"].values()) == smoke
    assert json.loads(report.to_json())["cases"][0]["kind"] == "compile"


def test_second_run_is_served_from_the_cache(env, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path))
    ragged_dot = folder_package(ROOT / "kernels/pallas/ragged_dot")
    first = gate.compile_matrix(ragged_dot, ["v5e"], tags=["smoke"], env=env)
    assert first.passed and not any(c.cached for c in first.cases)

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again although every case was cached")

    monkeypatch.setattr(gate, "compile_in_worker", no_compiler)
    second = gate.compile_matrix(ragged_dot, ["v5e"], tags=["smoke"], env=env)
    assert [c.name for c in second.cases] == [c.name for c in first.cases]
    assert all(c.cached and c.passed for c in second.cases)
    assert "cached" in str(second)
    # another libtpu is another key: that one is not served from this cache
    other = type(env)(env.python, env.jax_version, env.libtpu_version + ".post1")
    with pytest.raises(AssertionError, match="compiled again"):
        gate.compile_matrix(ragged_dot, ["v5e"], tags=["smoke"], env=other)


_BAD_PACKAGE = '''
import os

def _copy_kernel(shape, reshaped):
    import jax
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):  # the work happens in the reshaped form, so the reshapes cannot fold away
        o_ref[...] = x_ref[...] * 2 if reshaped is None else (x_ref[...].reshape(reshaped) * 2).reshape(shape)

    def build():
        fn = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(shape, x.dtype))(x)
        return fn, (jax.ShapeDtypeStruct(shape, "float32"),)
    return build

def _crash():
    os._exit(7)  # a compiler that takes the process down

def compile_cases():
    return [
        CompileCase("good", "float32", ("t",), _copy_kernel((8, 128), None)),
        CompileCase("crash", "float32", ("t",), _crash),
        CompileCase("bad_reshape", "float32", ("t",), _copy_kernel((8, 100), (800,))),
        CompileCase("good_after", "float32", ("t",), _copy_kernel((16, 128), None)),
    ]
'''


def test_compiler_refusal_and_crash_are_failed_cases_not_errors(env, tmp_path):
    pkg = write_package(tmp_path / "badkernel", {"__init__.py": '"""A kernel package with a case Mosaic rejects."""\n',
                                                "tpu_cases.py": _BAD_PACKAGE})
    package = local_package(pkg)  # hashed here: the worker imports only these files
    records = {r["name"]: r for r in compile_in_worker(env, package, ("v5e",))}
    assert list(records) == ["good", "crash", "bad_reshape", "good_after"]
    assert records["good"]["passed"] and records["good"]["argument_bytes"] == 8 * 128 * 4
    assert records["good_after"]["passed"]
    bad = records["bad_reshape"]
    assert not bad["passed"]
    assert bad["error"].startswith("Mosaic failed to compile TPU kernel")
    assert "unsupported shape cast" in bad["error"] and "\n" not in bad["error"]
    assert not records["crash"]["passed"] and "compiler process died (exit 7)" in records["crash"]["error"]


def test_missing_environment_is_one_clear_error(tmp_path):
    with pytest.raises(TpuEnvironmentError, match="kernel-hub setup-tpu"):
        find_tpu_python({}, checkout=tmp_path, built=tmp_path / "no-tpu-env")
    with pytest.raises(TpuEnvironmentError, match="KERNEL_HUB_TPU_PYTHON"):
        find_tpu_python({"KERNEL_HUB_TPU_PYTHON": str(tmp_path / "nope")}, checkout=tmp_path)


def test_cli_validate_tpu_flag(env, tmp_path, monkeypatch, capsys):
    from kernel_hub.cli import main

    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path))
    assert main(["validate", "--path", str(ROOT / "kernels/pallas/ragged_dot"), "--tag", "smoke",
                 "--tpu", "v6e"]) == 0
    out = capsys.readouterr().out
    assert "TPU compile (jax" in out and "v6e" in out and "fwd:decode_e128_f32" in out and "PASSED" in out
    assert main(["validate", "--tpu", "v9x"]) == 2
    err = capsys.readouterr().err
    assert "unknown TPU generation 'v9x'" in err and len(err.strip().splitlines()) == 1


def test_a_kernels_own_variables_are_part_of_the_cache_key(tmp_path):
    """A block override set in the environment (the worker inherits it) changes what compiles: its results get
    their own cache file, one per value; another kernel's or an unrelated variable leaves the key as it is."""
    from kernel_hub.tpu.compile_gate import cache

    target = folder_package(Path(__file__).resolve().parents[2] / "kernels" / "pallas" / "flash_attention")
    plain = gate.content_key(target, {})
    keys = [gate.content_key(target, {"FLASH_ATTENTION_PAGED_BLOCKS": v}) for v in ("32,4", "32,16")]
    assert len({plain, *keys}) == 3
    assert gate.content_key(target, {"RAGGED_DOT_X": "1", "PATH": "/bin"}) == plain
    assert gate.tuning_environment(target, {"FLASH_ATTENTION_PAGED_BLOCKS": "32,4", "HOME": "/"}) == {
        "FLASH_ATTENTION_PAGED_BLOCKS": "32,4"}
    for key in (plain, *keys):  # each a valid cache file name
        assert cache.entry_path(key, target.variant, "0.10.2", "0.0.42.1", "v6e", root=tmp_path).parent == tmp_path
