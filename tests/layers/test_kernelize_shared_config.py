"""Two models built from one config object: kernelizing or restoring one must never change the other.

transformers dispatches attention/experts by the name on the config, and models built from one config hold the same
object; kernelize gives each model private copies (layers/swap.py). The reference for each model is an
unkernelized deep copy with the same weights; causality is checked by changing only the last token.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.layers import is_kernelized  # noqa: E402
from kernel_hub.layers.kinds.attention import config_switch as at_config  # noqa: E402
from kernel_hub.layers.kinds.attention import dispatch as at  # noqa: E402
from kernel_hub.layers.kinds.experts import transformers as ex  # noqa: E402
from kernel_hub.layers.swap import give_back_configs, take_own_configs  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

TOL = 1e-4


def _pair(mode):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeForCausalLM

    cfg = tiny.tiny_config("qwen3_moe")
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        m = Qwen3MoeForCausalLM(cfg)
        models.append(m.train() if mode == "training" else m.eval())
    refs = [copy.deepcopy(m) for m in models]  # unkernelized, same weights, own config
    return cfg, models, refs


def _tokens():
    g = torch.Generator().manual_seed(3)
    x = torch.randint(3, 128, (2, 12), generator=g)
    x2 = x.clone()
    x2[:, -1] = (x[:, -1] + 7) % 125 + 3  # only the last token differs
    return x, x2


def _logits(model, x):
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # training mode: the same dropout draws on both sides
        return model(input_ids=x, use_cache=False).logits


def _check(model, ref, where):
    x, x2 = _tokens()
    out, out2, want = _logits(model, x), _logits(model, x2), _logits(ref, x)
    err = (out - want).abs().max().item()
    assert err <= TOL, f"{where}: logits {err:.2e} away from the unkernelized copy"
    shift = (out[:, :-1] - out2[:, :-1]).abs().max().item()
    assert shift <= TOL, f"{where}: earlier positions moved by {shift:.2e} when only the last token changed"


@pytest.mark.parametrize("order", ["first_then_second", "second_then_first"])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_two_models_from_one_config_stay_exact(order, mode):
    cfg, models, refs = _pair(mode)
    before = (cfg._attn_implementation, cfg._experts_implementation)
    reports = [kh.kernelize_report(kh.kernelize(m, mode=mode)) for m in models]
    for i, (m, ref) in enumerate(zip(models, refs, strict=True)):
        _check(m, ref, f"model {i} kernelized")
    for r in reports:  # both models really run the kernels (not silently kept)
        assert {k.kind for k in r.kept} == set(), str(r)
        assert {x.kind for x in r.replaced} == {ex.LAYER_KIND, at.LAYER_KIND, "rms_norm"}, str(r)
    assert (cfg._attn_implementation, cfg._experts_implementation) == before  # the caller's config is untouched
    sequence = [0, 1] if order == "first_then_second" else [1, 0]
    first, second = sequence
    assert kh.restore(models[first])
    assert models[first].config is cfg  # the original object is back
    _check(models[first], refs[first], f"model {first} restored")
    _check(models[second], refs[second], f"model {second} still kernelized, the other restored")
    assert is_kernelized(models[second]) and models[second].config._attn_implementation == at_config.IMPLEMENTATION_NAME
    assert kh.restore(models[second])
    _check(models[second], refs[second], f"model {second} restored")
    assert all(m.config is cfg for m in models)
    assert (cfg._attn_implementation, cfg._experts_implementation) == before


def test_one_kernelized_leaves_the_other_on_its_own_implementation():
    cfg, (a, b), (_, ref_b) = _pair("inference")
    kh.kernelize(a)
    assert b.config is cfg and cfg._attn_implementation == "sdpa"
    _check(b, ref_b, "unkernelized twin")
    kh.kernelize(b)  # kernelize the twin while the first is kernelized, then restore the first
    kh.restore(a)
    _check(b, ref_b, "twin kernelized after the first")
    kh.restore(b)


def test_own_configs_copy_sub_configs_once_and_give_back():
    from transformers import LlavaConfig

    cfg = LlavaConfig()
    top, text, other = torch.nn.Module(), torch.nn.Module(), torch.nn.Module()
    top.config, text.config, other.config = cfg, cfg.text_config, cfg.text_config
    top.text, top.other = text, other
    own = take_own_configs(top)
    assert top.config is not cfg and text.config is not cfg.text_config
    assert text.config is top.config.text_config and other.config is text.config  # sharing kept within the model
    top.config._attn_implementation = "eager"  # recurses into the copy's sub-configs only
    assert text.config._attn_implementation == "eager"
    assert cfg._attn_implementation != "eager" and cfg.text_config._attn_implementation != "eager"
    replaced = copy.deepcopy(cfg)
    other.config = replaced  # a config the user put there after kernelize stays
    give_back_configs(own)
    assert top.config is cfg and text.config is cfg.text_config and other.config is replaced
