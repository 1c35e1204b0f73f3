"""The Tokamax wrappers through kernel-hub: load + validate on this CPU, variant choice over the validated
tokamax/jax pair, and a published layout that carries the vendored shared code as real files."""

from __future__ import annotations

import importlib
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import kernel_hub as kh
from kernel_hub.decide.system import SystemFacts
from kernel_hub.decide.variants import choose_variant
from kernel_hub.package.metadata import load_metadata
from kernel_hub.publish.release import build_layout
from kernel_hub.verify.validation import run_case

ROOT = Path(__file__).resolve().parents[2]
RAGGED = ROOT / "kernels/pallas/tokamax_ragged_dot"
ATTENTION = ROOT / "kernels/pallas/tokamax_attention"
WRAPPERS = [RAGGED, ATTENTION]


@pytest.mark.parametrize("kernel_dir", WRAPPERS, ids=lambda p: p.name)
def test_loads_and_passes_the_harness_on_cpu(kernel_dir):
    module = kh.get_local_kernel(kernel_dir, backend="cpu")
    report = kh.validate(module, backend="cpu", seed=0)
    assert report.passed, str(report)
    assert {c.dtype for c in report.cases} == {"float32", "bfloat16"}


def test_ragged_dot_cpu_cases_run_the_hub_path_and_tokamax_as_oracle():
    module = kh.get_local_kernel(RAGGED, backend="cpu")
    report = kh.validate(module, backend="cpu", tags=("oracle",), seed=1)
    assert report.passed and {c.implementation for c in report.cases} == {"xla"}
    cases = importlib.import_module(f"{module.__name__}.validation").cases("cpu")
    assert {c.implementation for c in cases} == {"hub_cpu", "xla"}
    assert {c.routing for c in cases} >= {"empty_groups", "one_group", "partial", "all_empty"}


@pytest.mark.parametrize("kernel_dir", WRAPPERS, ids=lambda p: p.name)
def test_nan_output_never_passes(kernel_dir):
    module = kh.get_local_kernel(kernel_dir, backend="cpu")
    case = importlib.import_module(f"{module.__name__}.validation").cases("cpu")[0]
    inputs = case.inputs(0)
    expected = np.asarray(case.reference(inputs))

    def nan_kernel(*args, **kwargs):
        out = np.zeros_like(expected) + expected
        out.flat[0] = np.nan
        return out

    poisoned = SimpleNamespace(ragged_dot=nan_kernel, flash_attention=nan_kernel, decode_attention=nan_kernel)
    result = run_case(case, poisoned, 0)
    assert not result.passed and result.error == "NaN or Inf in output"


def facts(backend: str, *, jax: str | None = "0.10.2", tokamax: str | None = "0.0.12") -> SystemFacts:
    packages = (("tokamax", tokamax),) if tokamax else ()
    return SystemFacts(backend=backend, jax_version=jax, packages=packages)


@pytest.mark.parametrize("kernel_dir", WRAPPERS, ids=lambda p: p.name)
@pytest.mark.parametrize("backend", ["tpu", "cuda", "cpu"])
def test_variant_choice_accepts_the_validated_pair(kernel_dir, backend):
    choice = choose_variant(list(load_metadata(kernel_dir).variants), facts(backend))
    assert choice.variant is not None and choice.variant.name == f"jax-{backend}"


@pytest.mark.parametrize("kernel_dir", WRAPPERS, ids=lambda p: p.name)
@pytest.mark.parametrize(
    ("system", "reason"),
    [
        (facts("cpu", tokamax="0.0.13"), "needs tokamax==0.0.12, have 0.0.13"),
        (facts("tpu", jax="0.10.3"), "needs jax==0.10.2, have 0.10.3"),
        (facts("cuda", tokamax=None), "needs tokamax==0.0.12, not installed"),
    ],
)
def test_variant_choice_rejects_an_untested_pair_with_a_reason(kernel_dir, system, reason):
    choice = choose_variant(list(load_metadata(kernel_dir).variants), system)
    assert choice.variant is None
    rejected = {d.variant: d.reason for d in choice.trace}
    assert rejected[f"jax-{system.backend}"] == reason


def test_published_build_holds_the_shared_code_as_files(tmp_path):
    """Vendored shared modules (the hub CPU path, the dispatch, the references) ship as their content."""
    build_layout(RAGGED, tmp_path / "rd")
    build_layout(ATTENTION, tmp_path / "at")
    common = ROOT / "kernels/pallas/_common"
    shared = {
        (tmp_path / "rd", "tokamax_ragged_dot/_vendor/cpu_gmm.py"): common / "cpu_gmm.py",
        (tmp_path / "rd", "tokamax_ragged_dot/_vendor/groups.py"): common / "groups.py",
        (tmp_path / "rd", "tokamax_ragged_dot/_vendor/ragged_reference.py"): common / "ragged_reference.py",
        (tmp_path / "at", "tokamax_attention/_vendor/dispatch.py"): common / "dispatch.py",
        (tmp_path / "at", "tokamax_attention/_vendor/attention_reference.py"): common / "attention_reference.py",
    }
    for (out, name), source in shared.items():
        with tarfile.open(out / "build" / "jax-cpu.tar") as tar:
            member = tar.getmember(name)
            assert member.isfile()
            assert tar.extractfile(member).read() == source.read_bytes()
