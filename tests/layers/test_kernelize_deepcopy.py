"""copy.deepcopy of a kernelized model (attention, rms_norm and experts swapped) works: the copy has its own hooks
sharing the loaded kernel, restore() on the copy gives the original model's outputs bit for bit, and the original
stays kernelized until its own restore()."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402


def _logits(model, x):
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits


def _hooks(model):
    return {n: m.__dict__["forward"] for n, m in model.named_modules() if "forward" in m.__dict__}


@pytest.mark.parametrize("family", ["qwen3_moe", "gemma4"])
def test_a_deep_copied_kernelized_model_restores_to_the_original(family):
    model = tiny.tiny_model(family, dtype=torch.float32)
    x = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    before = _logits(model, x)
    report = kh.kernelize_report(kh.kernelize(model))
    assert {r.kind for r in report.replaced} >= {"attention", "rms_norm", "moe_experts"}
    kernelized = _logits(model, x)
    hooks = _hooks(model)
    assert hooks

    twin = copy.deepcopy(model)
    twin_hooks = _hooks(twin)
    assert twin_hooks.keys() == hooks.keys() and all(twin_hooks[n] is not hooks[n] for n in hooks)
    assert torch.equal(_logits(twin, x), kernelized)
    assert kh.restore(twin) is True
    assert not _hooks(twin) and torch.equal(_logits(twin, x), before)

    assert _hooks(model) == hooks  # the original is still kernelized, its own hooks in place
    assert torch.equal(_logits(model, x), kernelized)
    assert kh.restore(model) is True and torch.equal(_logits(model, x), before)
