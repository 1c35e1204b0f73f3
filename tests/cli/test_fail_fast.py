"""Fail fast: `publish` and `validate --tpu` check what takes a second to check (the TPU environment, the endpoint,
the token) before the minutes of validating: each test's validation would fail it if it were ever called."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernel_hub as kh
from kernel_hub.errors import KernelHubError
from kernel_hub.publish import release as publish_mod
from kernel_hub.tpu.env import ENV_VAR, TpuEnvironmentError
from kernel_hub.verify import validation

ROOT = Path(__file__).resolve().parents[2]
RAGGED = ROOT / "kernels/pallas/ragged_dot"  # declares jax-tpu and torch-tpu variants


@pytest.fixture
def no_validation(monkeypatch):
    def called(*args, **kwargs):
        raise AssertionError("validation ran before the quick checks failed")

    monkeypatch.setattr(publish_mod, "validate_local", called)
    monkeypatch.setattr(validation, "run_case", called)


def test_publish_says_the_tpu_environment_is_missing_before_validating(monkeypatch, tmp_path, no_validation):
    from tests.hub_server import running_server

    monkeypatch.setenv(ENV_VAR, str(tmp_path / "no-such-python"))
    # the endpoint is asked first (a release already there needs no gate), then the environment, before any case
    with running_server(tmp_path / "store", token="t") as srv, pytest.raises(TpuEnvironmentError, match=ENV_VAR):
        publish_mod.publish(RAGGED, endpoint=srv.url, token="t")


def test_publish_says_the_endpoint_is_unreachable_before_validating(no_validation):
    with pytest.raises(KernelHubError, match=r"127\.0\.0\.1:9.*whoami"):
        publish_mod.publish(RAGGED, endpoint="http://127.0.0.1:9", token="t", skip_tpu_compile=True)


def test_publish_says_the_token_is_missing_before_validating(monkeypatch, no_validation):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(KernelHubError, match="needs a write token"):
        publish_mod.publish(RAGGED, endpoint="http://127.0.0.1:9", skip_tpu_compile=True)


def test_publish_with_a_wrong_token_stops_before_validating(tmp_path, no_validation):
    from tests.hub_server import running_server

    with running_server(tmp_path / "store", token="right") as srv, pytest.raises(KernelHubError, match="HTTP 401"):
        publish_mod.publish(RAGGED, endpoint=srv.url, token="wrong", skip_tpu_compile=True)


def test_validate_tpu_says_the_tpu_environment_is_missing_before_any_case(monkeypatch, tmp_path, no_validation):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "no-such-python"))
    module = kh.get_local_kernel(RAGGED, backend="cpu")
    with pytest.raises(TpuEnvironmentError, match=ENV_VAR):
        kh.validate(module, backend="cpu", tpu=["v5e"])


def test_validate_tpu_refuses_an_unknown_generation_before_any_case(no_validation):
    module = kh.get_local_kernel(RAGGED, backend="cpu")
    with pytest.raises(ValueError, match="v99"):
        kh.validate(module, backend="cpu", tpu=["v99"])
