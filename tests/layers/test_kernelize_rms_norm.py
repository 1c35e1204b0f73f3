"""kernelize's `rms_norm` kind (layers/kinds/rms_norm.py) and the layer-kind declarations (layers/kinds/).

On the tiny Qwen3-MoE, Mixtral, GPT-OSS and Gemma 4: experts, attention and every RMSNorm the kernel serves are
replaced, logits agree, restore is bit-identical; the form (weight or 1 + weight, cast order) is read off each
layer's own outputs; a norm no form matches is kept with the errors; mapping={"rms_norm": None} skips the kind."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.errors import KernelHubError  # noqa: E402
from kernel_hub.layers import api  # noqa: E402
from kernel_hub.layers.kinds import BUILTIN_KINDS  # noqa: E402
from kernel_hub.layers.kinds.rms_norm import flow as kind  # noqa: E402
from kernel_hub.layers.kinds.rms_norm.plan import choose_form  # noqa: E402
from kernel_hub.package.metadata import load_metadata  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

REPO = "kernel-hub/rms-norm-tpu"
VERSION = load_metadata(Path(__file__).parents[2] / "kernels" / "pallas" / "rms_norm").version  # the embedded one


def _logits(model, x):
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits


def _norm_paths(model):
    """Every module named like an RMSNorm with a 1-D weight (what the kind says it serves), found independently."""
    return sorted(n for n, m in model.named_modules()
                  if type(m).__name__.endswith("RMSNorm") and getattr(m, "weight", None) is not None)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss", "gemma4"])
def test_families_replace_experts_attention_and_every_rms_norm(family):
    model = tiny.tiny_model(family, dtype=torch.float32)
    x = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    before = _logits(model, x)
    report = kh.kernelize_report(kh.kernelize(model))
    by_kind = {k: [r for r in report.replaced if r.kind == k] for k in ("moe_experts", "attention", "rms_norm")}
    assert by_kind["moe_experts"] and by_kind["attention"]
    norms = by_kind["rms_norm"]
    assert sorted(r.layer for r in norms) == _norm_paths(model) and norms
    assert all(r.repo_id == REPO and r.version == VERSION and r.max_error is not None and r.max_error <= 1e-4
               for r in norms)
    kept = [k for k in report.kept if k.kind == "rms_norm"]
    assert all("no 1-D weight" in k.reason for k in kept)  # Gemma 4's with_scale=False norms, and nothing else
    hooks = [model.get_submodule(r.layer).__dict__["forward"] for r in norms]
    after = _logits(model, x)
    assert all(h.calls >= 1 and h.fallbacks == 0 for h in hooks)  # every swapped norm ran the kernel
    assert ((after - before).abs().max() / before.abs().max()).item() <= 1e-4
    assert kh.restore(model) is True
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert torch.equal(_logits(model, x), before)


class _Pair(torch.nn.Module):
    def __init__(self, norms):
        super().__init__()
        self.norms = torch.nn.ModuleList(norms)

    def forward(self, x):
        return [n(x) for n in self.norms]


def _random_weights(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        module.weight.copy_(torch.randn(module.weight.shape, generator=g) * 0.5 + 0.5)
    return module


def test_the_form_is_read_from_the_layers_outputs_not_its_name():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gemma = _random_weights(GemmaRMSNorm(256, eps=1e-6), 1).to(torch.bfloat16)
    llama = _random_weights(LlamaRMSNorm(256, eps=1e-5), 2).to(torch.bfloat16)
    model = _Pair([gemma, llama])
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    before = model(x)
    report = kh.kernelize_report(kh.kernelize(model))
    rows = {r.layer: r for r in report.replaced}
    assert set(rows) == {"norms.0", "norms.1"}
    assert "(1 + weight) * x_normed, scaled in f32" in rows["norms.0"].layout
    assert "weight * x_normed, cast before scaling" in rows["norms.1"].layout
    after = model(x)
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))  # same op order: bit for bit
    kh.restore(model)
    assert all(torch.equal(a, b) for a, b in zip(model(x), before, strict=True))


class OffsetRMSNorm(torch.nn.Module):
    """Named like an RMSNorm and shaped like one, but adds a bias no kernel form has."""

    def __init__(self, h):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(h))
        self.variance_epsilon = 1e-6

    def forward(self, hidden_states):
        n = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * n + 0.5


def test_a_norm_no_form_matches_is_kept_with_the_errors():
    model = _Pair([OffsetRMSNorm(128)])
    report = kh.kernelize_report(kh.kernelize(model))
    assert not report.replaced
    (kept,) = report.kept
    assert kept.kind == "rms_norm" and kept.reason.startswith("validation failed: no form of the kernel matches")
    assert "forward" not in model.norms[0].__dict__ and not api.is_kernelized(model)


def test_mapping_none_skips_the_kind_and_an_instance_forward_is_restored_exactly():
    model = tiny.tiny_model("qwen3_moe", dtype=torch.float32)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"rms_norm": None, "attention": None}))
    assert not [r for r in report.replaced if r.kind == "rms_norm"]
    assert any(n.startswith("rms_norm unchanged: no kernel mapped") for n in report.notes)
    kh.restore(model)
    norm = model.get_submodule(_norm_paths(model)[0])
    mine = norm.forward  # a bound method set on the instance, as HF kernels' kernelize does
    norm.forward = mine
    kh.kernelize(model, mapping={"attention": None, "moe_experts": None})
    assert isinstance(norm.__dict__["forward"], kind.NormHook)
    kh.restore(model)
    assert norm.__dict__["forward"] is mine


def test_kinds_are_declared_once_and_drive_mapping_errors():
    from kernel_hub.layers.kinds.attention import dispatch as attention
    from kernel_hub.layers.kinds.experts import transformers as experts

    names = [k.name for k in BUILTIN_KINDS]
    assert names == ["moe_experts", "attention", "rms_norm"]
    assert tuple(names[:2]) == (experts.LAYER_KIND, attention.LAYER_KIND)  # the declarations name the same kinds
    assert tuple(names) == api.SUPPORTED_KINDS
    assert api.KIND_EXPORTS == {"moe_experts": "ragged_dot", "attention": "flash_attention", "rms_norm": "rms_norm"}
    with pytest.raises(KernelHubError, match="kernelize knows: moe_experts, attention, rms_norm"):
        kh.kernelize(torch.nn.Linear(2, 2), mapping={"norm": REPO})
    with pytest.raises(KernelHubError, match=r"mapping\['rms_norm'\] must be"):
        kh.kernelize(torch.nn.Linear(2, 2), mapping={"rms_norm": object()})


def test_choose_form_is_a_pure_decision_with_its_reason():
    index, why = choose_form([3e-3, 0.0, 1.0, 1.0], 1e-4)
    assert index == 1 and "scaled in f32" in why
    assert choose_form([0.0, 0.0, 1.0, 1.0], 1e-4)[0] == 0  # a tie keeps the first (f32 cannot tell orders)
    index, why = choose_form([1.0, 2.0, 3.0, 4.0], 1e-2)
    assert index is None and "validation failed" in why and "1.0e+00" in why


def test_training_mode_checks_gradients_and_the_swapped_norms_train():
    model = tiny.tiny_model("mixtral", dtype=torch.float32)
    x = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    ref_grads = {}
    model(input_ids=x, use_cache=False).logits.square().mean().backward()
    paths = _norm_paths(model)
    ref_grads = {p: model.get_submodule(p).weight.grad.clone() for p in paths}
    model.zero_grad()
    report = kh.kernelize_report(kh.kernelize(model, mode="training", mapping={"attention": None, "moe_experts": None}))
    rows = [r for r in report.replaced if r.kind == "rms_norm"]
    assert sorted(r.layer for r in rows) == paths and all(r.max_error <= 1e-4 for r in rows)
    model(input_ids=x, use_cache=False).logits.square().mean().backward()
    for p in paths:  # the kernel's backward reaches every norm's weight
        assert torch.allclose(model.get_submodule(p).weight.grad, ref_grads[p], rtol=1e-4, atol=1e-6), p
    kh.restore(model)


def test_a_compiled_swapped_norm_does_not_recompile_on_each_call():
    """The hook's call counter is an int attribute: bumped inside a compiled graph it was a guard that failed on every
    call, so torch.compile recompiled the model at each step (transformers' test_static_cache_no_recompile_with_
    smaller_length, GPT-OSS kernelized)."""
    model = tiny.tiny_model("qwen3_moe")
    ref = copy.deepcopy(model).model.norm  # same weights, its own forward
    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": None, "moe_experts": None}))
    assert any(r.kind == kind.NAME and r.layer == "model.norm" for r in report.replaced), str(report)
    norm = model.model.norm
    compiled = torch.compile(norm, backend="eager", fullgraph=True)
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(5)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):  # recompiled (and raised) at the second call before the fix
            x = torch.randn(2, 5, norm.weight.shape[0], generator=g)
            got = compiled(x)
            assert (got - ref(x)).abs().max().item() <= 1e-5
