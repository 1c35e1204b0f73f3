"""The Pallas kernels under the simulated TPU: NaN-filled uninitialised memory, race detection, and the
harness's validation cases. Plus the real-TPU run of the TPU validation cases."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ragged_dot as rd
from ragged_dot import validation
from ragged_dot._vendor import interpret as interpret_mod
from ragged_dot._vendor.interpret import RaceDetectedError, race_checking_params, races_found, run_race_checked
from ragged_dot_testutil import make_inputs

from kernel_hub.verify.numerics import TOLERANCE as TOL
from kernel_hub.verify.numerics import relative_error as rel_error
from kernel_hub.verify.validation import run_case

CFG = rd.RaggedDotConfig(tm=16, tk=128, tn=128)


@pytest.mark.parametrize(
    "sizes", [[10, 0, 30, 4], [0, 48, 0, 0], [0, 0, 0, 0], [3, 3, 3, 3]], ids=["mixed", "one", "empty", "partial"]
)
def test_forward_and_grads_under_tpu_simulation(sizes):
    lhs, rhs, gs = make_inputs(48, 128, 128, sizes, "float32", seed=3)
    interp = race_checking_params(seed=sum(sizes))
    out = run_race_checked(rd.ragged_dot, lhs, rhs, gs, implementation="pallas", interpret=interp, config=CFG)
    assert rel_error(out, rd.reference_ragged_dot(lhs, rhs, gs)) <= TOL["float32"]

    def loss(a, b):
        return jnp.sum(rd.ragged_dot(a, b, gs, implementation="pallas", interpret=interp, config=CFG) ** 2)

    d_lhs, d_rhs = run_race_checked(jax.grad(loss, (0, 1)), lhs, rhs)
    assert np.isfinite(np.asarray(d_lhs)).all() and np.isfinite(np.asarray(d_rhs)).all()
    assert not races_found()


def test_race_check_raises_and_resets(monkeypatch):
    monkeypatch.setattr(interpret_mod, "races_found", lambda: True)
    with pytest.raises(RaceDetectedError):
        interpret_mod.run_race_checked(lambda: jnp.zeros(2))
    with pytest.raises(ZeroDivisionError):
        interpret_mod.run_race_checked(lambda: 1 / 0)


def test_an_entry_with_race_detection_raises_on_a_race(monkeypatch):
    """The entry checks eager simulated runs itself: a reported race is an error, not a printed line."""
    lhs, rhs, gs = make_inputs(32, 128, 128, [16, 16], "float32", seed=4)
    monkeypatch.setattr(interpret_mod, "races_found", lambda: True)
    with pytest.raises(RaceDetectedError, match="ragged_dot"):
        rd.ragged_dot(lhs, rhs, gs, implementation="pallas", interpret=race_checking_params(), config=CFG)


def test_cpu_validation_cases_pass():
    cases = validation.cases("cpu")
    # 28 ragged dots + 10 moe_experts (2 of them the dense formulation's kernel) + 4 quantized (int8 / fp8 weights,
    # cpu path and interpreted Pallas)
    assert len({c.name for c in cases}) == len(cases) == 42
    for case in cases:
        result = run_case(case, rd, seed=11)
        assert result.passed, (case.name, result.max_error, result.error)
    tags = {t for c in cases for t in c.tags}
    assert {"decode", "prefill", "edge", "tpu_interpret", "moe", "quantized", "dense"} <= tags


def test_tpu_cases_use_compiled_pallas():
    tpu_cases = validation.cases("tpu")
    assert tpu_cases and all(c.interpret is None for c in tpu_cases)
    assert {c.implementation for c in tpu_cases} >= {"pallas"}


@pytest.mark.tpu
@pytest.mark.skipif(jax.default_backend() != "tpu", reason="needs a TPU")
def test_tpu_validation_cases_pass():
    for case in validation.cases("tpu"):
        result = run_case(case, rd, seed=5)
        assert result.passed, (case.name, result.max_error, result.error)
