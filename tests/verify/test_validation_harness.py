"""The validation harness on the toy kernel: passes, wrong numbers, NaN, raising kernels."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kernel_hub as kh
from kernel_hub.errors import ValidationFailedError
from kernel_hub.verify.validation import relative_error


def test_passing_kernel_reports_every_case(toy_kernel):
    report = kh.validate(kh.get_local_kernel(toy_kernel, backend="cpu"), backend="cpu", seed=1)
    assert report.passed and [c.name for c in report.cases] == ["small_f32", "empty"]
    assert all(c.max_error < 1e-6 and c.seconds >= 0 for c in report.cases)
    data = json.loads(report.to_json())
    assert data["passed"] is True and data["cases"][0]["dtype"] == "float32"
    assert "2/2 cases passed: PASSED" in str(report)


def _break(toy_kernel, new_body):
    ops = toy_kernel / "toy_scale/ops.py"
    ops.write_text(ops.read_text().replace("return np.asarray(x, dtype=np.float32) * np.float32(factor)", new_body))


def test_wrong_numbers_fail(toy_kernel):
    _break(toy_kernel, "return np.asarray(x, dtype=np.float32) * np.float32(factor) * 1.001")
    report = kh.validate(kh.get_local_kernel(toy_kernel, backend="cpu"), backend="cpu", seed=2)
    assert not report.passed
    small = report.cases[0]
    assert not small.passed and 5e-4 < small.max_error < 2e-3
    assert "FAILED" in str(report)


def test_nan_never_passes(toy_kernel):
    _break(toy_kernel, "y = np.asarray(x, dtype=np.float32) * np.float32(factor); y[:1] = np.nan; return y")
    report = kh.validate(kh.get_local_kernel(toy_kernel, backend="cpu"), backend="cpu", seed=3)
    bad = report.cases[0]
    assert not bad.passed and bad.error == "NaN or Inf in output"


def test_raising_kernel_fails_its_case(toy_kernel):
    _break(toy_kernel, "raise ValueError('bad shape')")
    report = kh.validate(kh.get_local_kernel(toy_kernel, backend="cpu"), backend="cpu", seed=4)
    assert not report.passed and "ValueError: bad shape" in report.cases[0].error


def test_get_kernel_validate_true_raises_and_caches_pass(toy_registry, toy_kernel):
    mod = kh.get_kernel("test-org/toy-scale", version=1, backend="cpu", validate=True)
    assert mod.__kernel_hub__.version == "1.2.0"
    _break(toy_kernel, "return np.asarray(x, dtype=np.float32) * 0")
    with pytest.raises(ValidationFailedError, match="failed validation on cpu: small_f32"):
        kh.get_kernel("test-org/toy-scale", version=1, backend="cpu", validate=True)


def test_relative_error_metric():
    e = np.array([1.0, -2.0, 4.0])
    assert relative_error(e, e) == 0.0
    assert relative_error(e + [0, 0, 0.04], e) == pytest.approx(0.01)
    assert relative_error(np.array([np.inf, 0, 0]), e) == float("inf")  # NaN/Inf never pass, on either side
    assert relative_error(e, np.array([np.nan, 0, 0])) == float("inf")
    assert relative_error(np.zeros(2), e) == float("inf")


def test_a_validation_module_without_cases_is_one_error_naming_the_contract(toy_kernel):
    """contract.ValidationModule is checked, not only declared: a validation.py without cases() is refused clearly."""
    (toy_kernel / "toy_scale/validation.py").write_text("CASES = []  # no cases() function\n")
    with pytest.raises(kh.KernelHubError, match=r"validation module has no cases\(backend, framework=\) function"):
        kh.validate(kh.get_local_kernel(toy_kernel, backend="cpu"), backend="cpu", seed=5)
