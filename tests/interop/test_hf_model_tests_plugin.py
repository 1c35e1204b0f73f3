"""The kernelize plugin for transformers' own model tests (tests/interop/hf_model_tests): a model built while it is
installed runs kernelized from its first call, the outer model whole and once, with the same outputs as the model
unpatched and the test's random generator untouched; the compat plugin sets only missing names."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel  # noqa: E402

from kernel_hub.layers.api import is_kernelized, kernelize_report  # noqa: E402
from tests.interop.hf_model_tests import kernelize_plugin as plugin  # noqa: E402
from tests.interop.hf_model_tests import tf_compat_plugin as compat  # noqa: E402


def _config() -> LlamaConfig:
    return LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, pad_token_id=0)


@pytest.fixture
def installed():
    original = plugin.install()
    plugin._records.clear()
    plugin._state["test"] = "unit"
    try:
        yield
    finally:
        plugin.uninstall(original)
        plugin._state["test"] = None


def test_first_call_kernelizes_the_outer_model_once(installed):
    torch.manual_seed(0)
    model = LlamaForCausalLM(_config()).eval()
    assert not is_kernelized(model)  # built, not yet called
    plugin.uninstall(PreTrainedModel.post_init.__wrapped__)
    reference = LlamaForCausalLM(_config()).eval()  # built without the hook: never kernelized
    reference.load_state_dict(model.state_dict())
    ids = torch.randint(1, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    want = reference(input_ids=ids).logits

    rng = torch.random.get_rng_state()
    got = model(input_ids=ids).logits
    assert torch.equal(torch.random.get_rng_state(), rng)  # kernelize's validation draws left the seed alone
    assert is_kernelized(model) and not is_kernelized(model.model)  # the outer model, whole
    assert len(kernelize_report(model).replaced) > 0
    assert model.__dict__.get(plugin._DONE) and model.model.__dict__.get(plugin._DONE)
    assert not is_kernelized(reference)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.isfinite(got).all()

    model(input_ids=ids)
    assert plugin._records["unit"]["models"] == 1  # once, not per call
    assert plugin._records["unit"]["replaced"] == len(kernelize_report(model).replaced)


def test_meta_weights_wait_for_a_real_call(installed):
    with torch.device("meta"):
        model = LlamaForCausalLM(_config())
    assert plugin.kernelize_once(model) is False
    assert not is_kernelized(model) and not model.__dict__.get(plugin._DONE)


def test_compat_sets_only_missing_names():
    import transformers.testing_utils as tu

    assert not hasattr(tu, "_kh_probe_name")
    try:
        done = compat.apply({"testing_utils": {"_kh_probe_name": {"a": 1}, "torch_device": "elsewhere"}})
        assert done == ["transformers.testing_utils._kh_probe_name"]
        assert tu._kh_probe_name == {"a": 1} and tu.torch_device != "elsewhere"
    finally:
        delattr(tu, "_kh_probe_name")
