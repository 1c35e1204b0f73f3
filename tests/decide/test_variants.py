"""Variant choice on simulated systems: TPU v5e/v6e/v4, CUDA, CPU, wrong framework versions."""

from pathlib import Path

import pytest

from kernel_hub.decide.system import SystemFacts, tpu_generation_from_kind
from kernel_hub.decide.variants import Variant, choose_variant
from kernel_hub.package.metadata import parse_metadata, read_yaml

ROOT = Path(__file__).resolve().parents[2]
_META = ROOT / "kernels/pallas/ragged_dot/kernel.yaml"
RAGGED = parse_metadata(read_yaml(_META), str(_META)).variants


def facts(backend, gen=None, jax="0.10.2", torch="2.13.0", packages=()):
    return SystemFacts(backend=backend, tpu_generation=gen, jax_version=jax, torch_version=torch, packages=packages)


@pytest.mark.parametrize(
    ("system", "framework", "expected"),
    [
        (facts("tpu", "v5e"), "jax", "jax-tpu"),
        (facts("tpu", "v6e"), "jax", "jax-tpu"),
        (facts("tpu", "v5p", packages=(("torch-tpu", "0.2.0"),)), "torch", "torch-tpu"),  # TorchTPU installed
        (facts("cuda"), "jax", "jax-cuda"),
        (facts("cuda"), "torch", "torch-cuda"),
        (facts("cpu"), "jax", "jax-cpu"),
        (facts("cpu"), "torch", "torch-cpu"),
    ],
)
def test_ragged_dot_variant_per_system(system, framework, expected):
    choice = choose_variant(list(RAGGED), system, framework)
    assert choice.variant is not None and choice.variant.name == expected
    by_name = {d.variant: d for d in choice.trace}
    assert len(by_name) == len(RAGGED)  # every variant judged
    assert all(not d.accepted for n, d in by_name.items() if n != expected)


def test_old_tpu_generation_is_rejected_with_reason():
    choice = choose_variant(list(RAGGED), facts("tpu", "v4"), "torch")
    assert choice.variant is None
    reason = {d.variant: d.reason for d in choice.trace}["torch-tpu"]
    assert "v4" in reason and "v5e" in reason


def test_untested_jax_is_rejected_with_reason():
    choice = choose_variant(list(RAGGED), facts("cpu", jax="0.9.0"), "jax")
    assert choice.variant is None
    assert "jax>=0.10,<0.11, have 0.9.0" in {d.variant: d.reason for d in choice.trace}["jax-cpu"]


def test_missing_framework_is_rejected():
    choice = choose_variant(list(RAGGED), facts("cpu", torch=None), "torch")
    assert choice.variant is None
    assert "not installed" in {d.variant: d.reason for d in choice.trace}["torch-cpu"]


def test_backend_specific_beats_universal():
    vs = [Variant("torch-universal", "torch", "universal"), Variant("torch-cpu", "torch", "cpu")]
    assert choose_variant(vs, facts("cpu"), "torch").variant.name == "torch-cpu"
    assert choose_variant(vs, facts("cuda"), "torch").variant.name == "torch-universal"


def test_unknown_tpu_generation_is_accepted():
    assert choose_variant(list(RAGGED), facts("tpu", None), "jax").variant.name == "jax-tpu"


@pytest.mark.parametrize(
    ("kind", "gen"),
    [("TPU v5 lite", "v5e"), ("TPU v5p", "v5p"), ("TPU v6e", "v6e"), ("TPU v4", "v4"), ("TPU7x", "v7x"),
     ("NVIDIA H200", None), ("cpu", None)],
)
def test_tpu_generation_from_device_kind(kind, gen):
    assert tpu_generation_from_kind(kind) == gen


def test_requirement_on_another_package_is_checked():
    v = [Variant("jax-cpu", "jax", "cpu", requires=(("jax", "==0.10.2"), ("tokamax", "==0.0.12")))]
    ok = SystemFacts(backend="cpu", jax_version="0.10.2", packages=(("tokamax", "0.0.12"),))
    assert choose_variant(v, ok, "jax").variant is not None
    untested = SystemFacts(backend="cpu", jax_version="0.10.2", packages=(("tokamax", "0.0.13"),))
    choice = choose_variant(v, untested, "jax")
    assert choice.variant is None and "needs tokamax==0.0.12, have 0.0.13" in choice.trace[0].reason
    missing = SystemFacts(backend="cpu", jax_version="0.10.2")
    assert "tokamax" in choose_variant(v, missing, "jax").trace[0].reason
