"""kernelize with attention swapped too, across every MoE family the family matrix runs (test_kernelize_families.py
pins the MoE path alone), plus the cases that once went wrong there: multi-head latent attention (value head size
!= query/key head size) and DeepSeek sparse attention (DSA: an indexer's top-k keys, handed to any implementation
but eager/sdpa as `indices` instead of a mask; mistral_large4 and glm_moe_dsa came out 0.18 and 0.83 off).

The reference is always the model's own default forward, captured before kernelize; which layers call attention is
recorded independently (a wrapper on the default attention functions during that forward), so the report's rows are
checked against what the model really does.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.errors import KernelHubError  # noqa: E402
from kernel_hub.layers.kinds.attention import call_plan as at_plan  # noqa: E402
from kernel_hub.layers.kinds.attention import dispatch as at  # noqa: E402
from kernel_hub.layers.kinds.attention import heads as at_heads  # noqa: E402
from kernel_hub.layers.kinds.attention import kernel_call as at_kernel  # noqa: E402
from kernel_hub.layers.kinds.attention import plan  # noqa: E402
from kernel_hub.verify.numerics import relative_error, tolerance  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

REPO = "kernel-hub/flash-attention-tpu"
TOL = tolerance(torch.float32)
#: The DeepSeek sparse attention families whose tiny configs pick fewer keys than the input has.
DSA = ("mistral_large4", "glm_moe_dsa")
FAMILIES = ([("tiny", f) for f in tiny.family_names()] + [("generic", f) for f in tiny.GENERIC_FAMILIES]
            + [("hand", f) for f in tiny.hand_family_names()])


@pytest.fixture(scope="module")
def fa():
    return kh.get_kernel(REPO, framework="torch", backend="cpu")


class Spy(types.SimpleNamespace):
    """The torch flash-attention module, counting flash_attention calls (so nothing passes with the kernel idle)."""

    def __init__(self, kernel):
        super().__init__(calls=0, __kernel_hub__=kernel.__kernel_hub__, describe=kernel.describe)
        self._fn = kernel.flash_attention

    def flash_attention(self, *args, **kwargs):
        self.calls += 1
        return self._fn(*args, **kwargs)


def build(kind, family, **overrides):
    if importlib.util.find_spec(f"transformers.models.{family}") is None and kind != "hand":
        pytest.skip(f"{family} is not in this transformers")
    if kind == "tiny":
        return tiny.tiny_model(family, **overrides)
    return tiny.generic_tiny_model(family) if kind == "generic" else tiny.hand_tiny_model(family)


def tokens():
    return torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))


def output(model, x, mask=None):
    with torch.no_grad():
        out = model(input_ids=x, attention_mask=mask, use_cache=False)
    logits = getattr(out, "logits", None)
    return (logits if logits is not None else out.last_hidden_state).float()


@contextlib.contextmanager
def recording(model):
    """Names of the modules that call the default attention functions (sdpa, or their modeling file's eager)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    names = {id(m): n for n, m in model.named_modules()}
    seen: list[str] = []

    def wrap(fn):
        def recorded(module, *args, **kwargs):
            seen.append(names.get(id(module), "?"))
            return fn(module, *args, **kwargs)
        return recorded

    mapping = ALL_ATTENTION_FUNCTIONS._global_mapping
    sdpa = mapping["sdpa"]
    modules = {sys.modules[type(m).__module__] for m in model.modules()}
    eagers = {mod: mod.eager_attention_forward for mod in modules if hasattr(mod, "eager_attention_forward")}
    mapping["sdpa"] = wrap(sdpa)
    for mod, fn in eagers.items():
        mod.eager_attention_forward = wrap(fn)
    try:
        yield seen
    finally:
        mapping["sdpa"] = sdpa
        for mod, fn in eagers.items():
            mod.eager_attention_forward = fn


@pytest.mark.parametrize(("kind", "family"), FAMILIES, ids=[f for _, f in FAMILIES])
def test_family_with_attention(kind, family, fa):
    model = build(kind, family)
    x = tokens()
    with recording(model) as seen:
        before = output(model, x)
    layers = set(seen)
    spy = Spy(fa)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": spy}))
    replaced = {r.layer for r in report.replaced if r.kind == "attention"}
    kept = {k.layer: k.reason for k in report.kept if k.kind == "attention"}
    failed = [n for n in report.notes if n.startswith("attention kept: validation forward failed")]
    if failed:  # the model's own default cannot run kernelize's padded validation batch: nothing is swapped
        mask = torch.ones(2, 24, dtype=torch.long)
        mask[1, :5] = 0
        with pytest.raises(Exception):  # noqa: B017 (whatever the model itself raises)
            output(model, torch.randint(3, 100, (2, 24)), mask)
        assert not replaced and not kept
    else:  # every layer that calls attention is replaced or kept with its reason, and nothing else is listed
        assert replaced | set(kept) == layers and not replaced & set(kept)
        assert all(reason.strip() for reason in kept.values())
    calls = spy.calls
    after = output(model, x)
    hooks = {p: model.get_submodule(p).__dict__[at.HOOK_ATTR] for p in replaced}
    # each replaced layer ran the kernel as often as it called attention in the default forward, never falling back
    assert {p: (h.calls, h.fallbacks) for p, h in hooks.items()} == {p: (seen.count(p), 0) for p in replaced}
    assert spy.calls - calls == sum(seen.count(p) for p in replaced)
    assert relative_error(after, before) <= TOL
    assert kh.restore(model) is True
    assert torch.equal(output(model, x), before)


@pytest.mark.parametrize("family", DSA)
def test_sparse_attention_keeps_the_model_on_its_own_attention(family, fa, monkeypatch):
    model = tiny.hand_tiny_model(family)
    x = tokens()
    before = output(model, x)
    previous = model.config._attn_implementation
    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": Spy(fa), "moe_experts": None}))
    kept = [k for k in report.kept if k.kind == "attention"]
    assert len(kept) == 2 and not [r for r in report.replaced if r.kind == "attention"]
    assert all("top-k key indices (`indices`)" in k.reason for k in kept)
    assert model.config._attn_implementation == previous  # the model is not switched at all
    assert relative_error(output(model, x), before) <= TOL
    kh.restore(model)

    # Without the sparse-kwarg rule the whole-model switch check alone still keeps it (and says why).
    monkeypatch.setattr(at, "sparse_selection", lambda kwargs: "")
    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": Spy(fa), "moe_experts": None}))
    kept = [k for k in report.kept if k.kind == "attention"]
    assert len(kept) == 2 and all("computes differently once its attention implementation" in k.reason
                                  for k in kept)
    assert relative_error(output(model, x), before) <= TOL
    kh.restore(model)
    assert torch.equal(output(model, x), before)


@pytest.mark.parametrize("dv", [8, 24], ids=["v-smaller", "v-larger"])
def test_latent_attention_head_sizes_run_on_the_kernel(dv, fa):
    # DeepSeek-V3 MLA: q/k head 8+8 = 16; the value head smaller (as in the real model: 192 vs 128) or larger.
    model = tiny.tiny_model("deepseek_v3", num_key_value_heads=4, v_head_dim=dv)
    x = tokens()
    mask = torch.ones_like(x)
    mask[1, :2] = 0
    before = [output(model, x), output(model, x, mask)]
    spy = Spy(fa)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": spy}))
    attn = [r for r in report.replaced if r.kind == "attention"]
    assert len(attn) == 3 and not [k for k in report.kept if k.kind == "attention"]
    calls = spy.calls
    after = [output(model, x), output(model, x, mask)]
    assert spy.calls - calls == 6
    assert relative_error(after[0], before[0]) <= TOL
    rows = mask.bool()
    assert relative_error(after[1][rows], before[1][rows]) <= TOL
    kh.restore(model)
    assert torch.equal(output(model, x), before[0])


def reference(q, k, v, scale, causal):
    """float64 softmax attention (same head count for q and k/v)."""
    q, k, v = q.double(), k.double(), v.double()
    logits = q @ k.transpose(-1, -2) * scale
    if causal:
        sq, skv = logits.shape[-2:]
        logits = logits.masked_fill(torch.ones(sq, skv, dtype=torch.bool).triu(skv - sq + 1), float("-inf"))
    return torch.softmax(logits, -1) @ v


@pytest.mark.parametrize(("d", "dv", "scaling"), [(24, 16, 0.3), (16, 24, 0.3), (24, 16, None), (16, 16, None)])
def test_run_plan_pads_head_sizes_exactly(d, dv, scaling, fa):
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 4, 7, d, generator=g), torch.randn(2, 4, 7, d, generator=g)
    v = torch.randn(2, 4, 7, dv, generator=g)
    pad, why = at_heads.plan_heads(tuple(q.shape), tuple(k.shape), tuple(v.shape), scaling)
    assert why == "" and pad.dv == dv and pad.qk == max(0, dv - d) and pad.v == max(0, d - dv)
    out = at_kernel.run_plan(fa.flash_attention, at_plan.AttentionCallPlan(causal=True, window=None), q, k, v, pad=pad,
                      softcap=None, sinks=None)
    expected = reference(q, k, v, scaling if scaling is not None else d ** -0.5, causal=True)
    assert out.shape == expected.shape and relative_error(out, expected) <= TOL


def test_decisions():
    assert at_heads.plan_heads((1, 2, 3, 8), (1, 2, 3, 8), (1, 2, 4, 8), None)[0] is None  # value length differs
    assert "query head size" in at_heads.plan_heads((1, 2, 3, 4), (1, 2, 3, 8), (1, 2, 3, 8), None)[1]
    assert at_plan.sparse_selection({"indices": None, "block_indices": None}) == ""
    assert "`indices`" in at_plan.sparse_selection({"indices": torch.zeros(1, 2, 1)})
    assert "`block_indices`" in at_plan.plan_kwargs({"block_indices": torch.zeros(1)}, training=False)
    assert at_plan.plan_kwargs({"dropout": 0.1}, training=True) == "attention dropout"
    assert at_plan.plan_kwargs({"dropout": 0.1, "position_bias": None}, training=False) == ""
    a = [torch.ones(2, 3), None]
    assert plan.switch_check(a, [torch.ones(2, 3), None], TOL, "sdpa") == ""
    why = plan.switch_check(a, [torch.full((2, 3), 1.5), None], TOL, "sdpa")
    assert "not 'sdpa'" in why and "5.00e-01" in why
    assert plan.switch_check(a, [torch.full((2, 3), float("nan")), None], TOL, "eager")


def test_a_sparse_call_never_runs_silently(fa):
    model = tiny.hand_tiny_model("glm_moe_dsa")
    module = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 3, 16)
    module.__dict__[at.HOOK_ATTR] = at.AttentionHook(flash=fa.flash_attention, previous="sdpa")
    try:
        with pytest.raises(KernelHubError, match="indices"):
            at.kernel_hub_attention(module, q, q, q, None, scaling=0.25, indices=torch.zeros(1, 3, 2, dtype=torch.long))
    finally:
        module.__dict__.pop(at.HOOK_ATTR)


def test_switch_check_is_not_fooled_by_dropout(fa):
    # Training mode with attention dropout: the forwards before and after the switch draw the same dropout, so the
    # layers are kept for the dropout the kernel does not do, not for a model that computes differently.
    model = tiny.llama()
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.2
    model.train()
    report = kh.kernelize_report(
        kh.kernelize(model, mode="training", mapping={"attention": Spy(fa), "moe_experts": None}))
    kept = [k.reason for k in report.kept if k.kind == "attention"]
    assert kept == ["validation call fell back: attention dropout"] * 2
