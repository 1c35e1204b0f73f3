"""The call-time hooks of kernelize count what they served in one way (swap.CallCounts): every call outside
torch.compile is counted, as served or as handed back with the reason; inside a traced graph nothing is (an int
attribute bumped there is a guard that fails on every call). The three hooks: the rms_norm instance forward, the
transformers attention function's per-layer hook and the Diffusers attention processor."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kernel_hub.layers.kinds.attention import config_switch as at_config  # noqa: E402
from kernel_hub.layers.kinds.attention import dispatch as at  # noqa: E402
from kernel_hub.layers.kinds.attention.diffusers_route import AttentionRoute  # noqa: E402
from kernel_hub.layers.kinds.rms_norm.flow import NormHook  # noqa: E402
from kernel_hub.layers.swap import CallCounts  # noqa: E402

SDPA = torch.nn.functional.scaled_dot_product_attention


def eager_attention_forward(module, query, key, value, attention_mask, **kwargs):
    """What the attention hook falls back to for a module of this file (found by its module's name, as transformers
    modeling files define it)."""
    return SDPA(query, key, value, attn_mask=attention_mask).transpose(1, 2), None


class Attn(torch.nn.Module):
    is_causal = False


def _flash(q, k, v, *, causal=False, sm_scale=None, **_):
    return SDPA(q, k, v, is_causal=causal, scale=sm_scale)


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, 4, 8, generator=g) for _ in range(3)]


def _calls(norm, attention, route):
    """One served and one handed-back call on each hook."""
    x = torch.randn(3, 8)
    norm(x)
    norm(x.double())  # not the weight's dtype: handed back
    q, k, v = _qkv()
    module = attention[0]
    at.kernel_hub_attention(module, q, k, v, None)
    at.kernel_hub_attention(module, q, k, v, torch.randn(1, 1, 4, 4))  # an additive mask with bias values
    route._sdpa((q, k, v), {})
    route._sdpa((q, k, v), {"dropout_p": 0.5})


def _hooks():
    ln = torch.nn.RMSNorm(8, eps=1e-6)
    kernel = type("K", (), {"rms_norm": staticmethod(lambda x, w, **kw: ln.forward(x))})()
    norm = NormHook(kernel, ln, ln.forward, False, False)
    module, hook = Attn(), at.AttentionHook(flash=_flash, previous="eager")
    module.__dict__[at.HOOK_ATTR] = hook
    route = AttentionRoute(object(), _flash)
    return norm, (module, hook), route


def test_every_hook_counts_served_and_handed_back_calls_with_the_reason():
    norm, attention, route = _hooks()
    _calls(norm, attention, route)
    hook = attention[1]
    for counts in (norm, hook, route):
        assert isinstance(counts, CallCounts)
        assert (counts.calls, counts.fallbacks) == (1, 1), type(counts).__name__
    assert "torch.float64" in norm.last_fallback and "torch.float32" in norm.last_fallback
    assert hook.last_fallback == "additive mask with bias values"
    assert route.last_fallback == "attention dropout"


def test_no_hook_counts_inside_torch_compile(monkeypatch):
    norm, attention, route = _hooks()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    _calls(norm, attention, route)
    for counts in (norm, attention[1], route):
        assert (counts.calls, counts.fallbacks, counts.last_fallback) == (0, 0, ""), type(counts).__name__


def test_the_route_keeps_identity_equality_and_its_hash():
    """CallCounts adds no __eq__: two routes with the same counts are still two processors (Diffusers may key them)."""
    a, b = AttentionRoute(object(), _flash), AttentionRoute(object(), _flash)
    assert a != b and len({a, b}) == 2
    assert sys.modules[__name__].eager_attention_forward is at_config.previous_function(Attn(), "eager")
