"""What a kernelized model reports and honours: attention weights on request, and the user's later choice of
attention / experts implementation (restore still gives back the original).

References are unkernelized deep copies with the same weights; attention weights come from the eager attention
(the only transformers implementation that computes them).
"""

from __future__ import annotations

import copy
import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.layers.kinds.attention import config_switch as at_config  # noqa: E402
from kernel_hub.layers.kinds.attention import dispatch as at  # noqa: E402
from kernel_hub.layers.kinds.experts import transformers as ex  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

TOL = 1e-4


def _x():
    return torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(11))


def _out(model, x, **kwargs):
    with torch.no_grad():
        return model(input_ids=x, use_cache=False, **kwargs)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_output_attentions_returns_the_weights(implementation, caplog):
    m = tiny.tiny_model("qwen3_moe")
    m.set_attn_implementation(implementation)
    ref = copy.deepcopy(m)
    ref.set_attn_implementation("eager")
    report = kh.kernelize_report(kh.kernelize(m))
    assert any(r.kind == at.LAYER_KIND for r in report.replaced), str(report)
    x = _x()
    want = _out(ref, x, output_attentions=True)
    at._weights_logged = False
    with caplog.at_level(logging.WARNING, logger=at.__name__):
        got = _out(m, x, output_attentions=True)
    assert "attention weights were requested" in caplog.text
    assert got.attentions is not None and len(got.attentions) == len(want.attentions) == 2
    for a, b in zip(got.attentions, want.attentions, strict=True):
        assert a is not None and a.shape == b.shape
        assert (a - b).abs().max().item() <= TOL
    assert (got.logits - want.logits).abs().max().item() <= TOL
    spy = [mod.__dict__[at.HOOK_ATTR] for mod in m.modules() if at.HOOK_ATTR in mod.__dict__]
    calls = sum(h.calls for h in spy)
    _out(m, x)  # without the request the kernel serves the calls again
    assert sum(h.calls for h in spy) == calls + len(spy)


def test_later_set_attn_implementation_wins_and_restore_gives_back_the_original():
    m = tiny.tiny_model("qwen3_moe")
    cfg = m.config
    ref = copy.deepcopy(m)
    kh.kernelize(m)
    assert m.config._attn_implementation == at_config.IMPLEMENTATION_NAME  # the name transformers dispatches on
    assert m.config._experts_implementation == ex.IMPLEMENTATION_NAME
    hooks = [mod.__dict__[at.HOOK_ATTR] for mod in m.modules() if at.HOOK_ATTR in mod.__dict__]
    x = _x()
    m.set_attn_implementation("eager")
    assert m.config._attn_implementation == "eager"
    calls = sum(h.calls for h in hooks)
    got = _out(m, x, output_attentions=False)
    assert sum(h.calls for h in hooks) == calls  # eager ran, not the kernel
    assert (got.logits - _out(ref, x).logits).abs().max().item() <= TOL
    m.set_experts_implementation("eager")
    assert m.config._experts_implementation == "eager"
    assert (_out(m, x).logits - _out(ref, x).logits).abs().max().item() <= TOL
    m.set_attn_implementation(at_config.IMPLEMENTATION_NAME)  # back onto the kernel
    calls = sum(h.calls for h in hooks)
    _out(m, x)
    assert sum(h.calls for h in hooks) == calls + len(hooks)
    assert kh.restore(m)
    assert m.config is cfg and cfg._attn_implementation == "sdpa" and cfg._experts_implementation == "grouped_mm"
    assert "set_experts_implementation" not in m.__dict__
    assert torch.equal(_out(m, x).logits, _out(ref, x).logits)


def test_config_output_attentions_is_accepted_and_honoured():
    """transformers' own attention-output test sets `model.config.output_attentions = True` on the model it built; its
    config refuses that for every name but eager, so a kernelized (eager) model raised where the plain one worked."""
    m = tiny.tiny_model("qwen3_moe")
    m.set_attn_implementation("eager")
    ref = copy.deepcopy(m)
    report = kh.kernelize_report(kh.kernelize(m))
    assert any(r.kind == at.LAYER_KIND for r in report.replaced), str(report)
    m.config.output_attentions = True  # raised "not supported ... kernel_hub" before
    m.config.validate_output_attentions()
    assert m.config.output_attentions is True
    assert m.config._attn_implementation == at_config.IMPLEMENTATION_NAME  # the name kernelize reports stays
    ref.config.output_attentions = True
    x = _x()
    got, want = _out(m, x), _out(ref, x)
    assert got.attentions is not None and len(got.attentions) == len(want.attentions) == 2
    for a, b in zip(got.attentions, want.attentions, strict=True):
        assert a is not None and a.shape == b.shape
        assert (a - b).abs().max().item() <= TOL
    assert (got.logits - want.logits).abs().max().item() <= TOL
    plain = copy.deepcopy(ref.config)
    plain.output_attentions = False
    plain._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="not supported"):  # every other name keeps transformers' rule
        plain.output_attentions = True


def test_output_attentions_acceptance_is_the_kernelized_models_own():
    """The acceptance lives on the kernelized model's private config copy (a subclass of its own class), not on
    transformers' PretrainedConfig: another model's config, never kernelized, keeps transformers' rule even under the
    name "kernel_hub", and restore gives the model its original config of its original class."""
    import pickle

    import transformers.configuration_utils as cu
    from transformers import PretrainedConfig

    m, other = tiny.tiny_model("qwen3_moe"), tiny.tiny_model("qwen3_moe")
    cfg, cls = m.config, type(m.config)
    report = kh.kernelize_report(kh.kernelize(m))
    assert any(r.kind == at.LAYER_KIND for r in report.replaced), str(report)
    assert type(other.config) is cls  # the never-kernelized model: its class, transformers' setter and validator
    prop = PretrainedConfig.__dict__["output_attentions"]
    assert prop.fset.__module__ == cu.__name__ and PretrainedConfig.validate_output_attentions.__module__ == cu.__name__
    stranger = copy.deepcopy(other.config)
    stranger._attn_implementation_internal = at_config.IMPLEMENTATION_NAME  # the name alone grants nothing
    with pytest.raises(ValueError, match="not supported"):
        stranger.output_attentions = True
    stranger._output_attentions = True
    with pytest.raises(ValueError, match="not supported"):
        stranger.validate_output_attentions()

    mine = m.config
    assert mine is not cfg and type(mine) is not cls and isinstance(mine, cls) and type(mine).__name__ == cls.__name__
    mine.output_attentions = True
    mine.validate_output_attentions()
    if hasattr(mine, "validate"):
        mine.validate()  # transformers' strict validators too (save_pretrained runs them)
    assert mine.output_attentions is True and mine._attn_implementation == at_config.IMPLEMENTATION_NAME
    assert repr(mine).startswith(cls.__name__) and mine.to_diff_dict()["output_attentions"] is True
    again = pickle.loads(pickle.dumps(mine))
    assert type(again) is type(mine) and again.output_attentions is True
    mine.output_attentions = False

    assert kh.restore(m)
    assert m.config is cfg and type(m.config) is cls and type(mine) is cls  # the copy's class is put back too
    with pytest.raises(ValueError, match="not supported"):
        m.config.output_attentions = True  # restored to sdpa: transformers' rule again


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_output_attentions_with_padding_and_a_window_equal_eager(family):
    """With padding (and Mixtral's sliding window) the model builds the previous implementation's mask, sdpa's bool
    keep-mask; the eager attention that computes the weights adds its mask to the scores, so it must get the additive
    form (a bool mask added 1 to the kept scores and masked nothing). Reference: the same weights on eager."""
    m = tiny.tiny_model(family, num_hidden_layers=2, **({"sliding_window": 3} if family == "mixtral" else {}))
    ref = copy.deepcopy(m)
    ref.set_attn_implementation("eager")
    kh.kernelize(m)
    x = _x()
    mask = torch.ones_like(x)
    mask[1, :3] = 0  # left padding
    want = _out(ref, x, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    got = _out(m, x, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    keep = mask.bool()
    for a, b in zip(got.hidden_states, want.hidden_states, strict=True):
        assert torch.isfinite(a[keep]).all() and (a[keep] - b[keep]).abs().max().item() <= TOL
    for a, b in zip(got.attentions, want.attentions, strict=True):  # [B, H, Sq, Skv]: the real query rows
        a, b = a.transpose(1, 2)[keep], b.transpose(1, 2)[keep]
        assert (a - b).abs().max().item() <= TOL
    assert got.attentions[0][1, :, 3:, :3].abs().max().item() == 0.0  # no real query attends a padding key
    assert (got.logits[keep] - want.logits[keep]).abs().max().item() <= TOL
