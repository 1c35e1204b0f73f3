"""kernelize / restore on tiny transformers MoE models built from configs with random weights.

The reference is always the model's own default experts implementation (outputs captured before
kernelize), and the kernel is spied on so a test cannot pass by the kernel silently not running.
"""

from __future__ import annotations

import copy
import json
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.errors import KernelHubError  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

FAMILIES = tiny.family_names()


# These tests pin the MoE path: attention stays on its default (test_kernelize_attention.py covers it).
pytestmark = pytest.mark.usefixtures("experts_only")


@pytest.fixture(scope="module")
def kernel():
    return kh.get_kernel("kernel-hub/ragged-dot-tpu", framework="torch", backend="cpu")


class Spy(types.SimpleNamespace):
    """Wraps a kernel module, counting moe_experts calls; keeps its __kernel_hub__ for the report."""

    def __init__(self, kernel, moe=None):
        super().__init__(calls=0, __kernel_hub__=kernel.__kernel_hub__, ragged_dot=kernel.ragged_dot,
                         describe=kernel.describe)
        self._moe = moe or kernel.moe_experts

    def moe_experts(self, *args, **kwargs):
        self.calls += 1
        return self._moe(*args, **kwargs)


def ids(seed=0, batch=2, length=9):
    return torch.randint(3, 120, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(x).logits.float()


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("family", FAMILIES)
def test_family_f32_logits_generate_and_restore(family, kernel):
    model = tiny.tiny_model(family)
    x = ids()
    before = logits(model, x)
    gen_before = model.generate(x[:1, :5], max_new_tokens=8, do_sample=False)
    impl_before = model.get_experts_implementation()
    spy = Spy(kernel)

    report = kh.kernelize_report(kh.kernelize(model, mapping={"moe_experts": spy}))
    n_moe = sum(1 for _, m in model.named_modules() if type(m).__name__.endswith("Experts"))
    assert len(report.replaced) == n_moe >= 1 and not report.kept
    assert all(r.max_error is not None and r.max_error <= 1e-4 for r in report.replaced)
    calls = spy.calls
    after = logits(model, x)
    assert spy.calls == calls + n_moe  # every expert layer ran on the kernel
    assert rel(after, before) <= 1e-4
    gen_after = model.generate(x[:1, :5], max_new_tokens=8, do_sample=False)
    assert torch.equal(gen_after, gen_before)

    assert kh.restore(model) is True
    assert model.get_experts_implementation() == impl_before
    calls = spy.calls
    assert torch.equal(logits(model, x), before)  # bit-identical to before kernelize
    assert spy.calls == calls
    assert not any("_kernel_hub_experts" in m.__dict__ for m in model.modules())
    assert kh.restore(model) is False  # second restore: nothing to undo


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "deepseek_v3", "gemma4"])
def test_family_bf16_logits(family):
    model = tiny.tiny_model(family, dtype=torch.bfloat16)
    x = ids(1)
    before = logits(model, x)
    report = kh.kernelize_report(kh.kernelize(model))
    assert report.replaced and all(r.max_error <= 2e-2 for r in report.replaced)
    assert rel(logits(model, x), before) <= 2e-2
    kh.restore(model)
    assert torch.equal(logits(model, x), before)


def test_layouts_are_read_not_assumed():
    report = kh.kernelize_report(kh.kernelize(tiny.tiny_model("gpt_oss")))
    assert {r.layout for r in report.replaced} == {"[E,H,2I], gate/up interleaved, bias"}
    report = kh.kernelize_report(kh.kernelize(tiny.tiny_model("mixtral")))
    assert {r.layout for r in report.replaced} == {"[E,2I,H], gate/up concatenated"}


def test_report_fields_json_and_table(kernel):
    model = tiny.tiny_model("qwen3_moe")
    report = kh.kernelize_report(kh.kernelize(model))
    r = report.replaced[0]
    assert r.layer == "model.layers.0.mlp.experts"
    assert r.repo_id == "kernel-hub/ragged-dot-tpu" and r.version == kernel.__kernel_hub__.version
    assert r.variant == "torch-cpu" and r.commit and "torch-native" in r.implementation
    assert r.route == "interface"
    data = json.loads(report.to_json())
    assert data["replaced"][1]["layer"] == "model.layers.1.mlp.experts"
    assert data["mode"] == "inference" and data["backend"] == "cpu"
    text = str(report)
    assert "model.layers.1.mlp.experts" in text and "torch-cpu" in text and "2 layer(s) kernelized" in text
    assert isinstance(report, kh.KernelizeReport)


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_training_gradients_match_default(family):
    x = ids(2)

    def grads(model):
        model.train()
        model.zero_grad()
        out = model(x, labels=x)
        out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model = tiny.tiny_model(family)
    loss_ref, ref = grads(model)
    report = kh.kernelize_report(kh.kernelize(model, mode="training"))
    assert report.mode == "training" and len(report.replaced) == 2 and not report.kept
    loss, got = grads(model)
    assert abs(loss.item() - loss_ref.item()) <= 1e-5 * abs(loss_ref.item())
    assert got.keys() == ref.keys()
    expert_params = [n for n in ref if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert expert_params  # gradients reach the expert weights through the kernel
    for name in ref:
        assert rel(got[name], ref[name]) <= 1e-3, name


def test_model_without_moe_is_unchanged():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    x = ids(3)
    x = x % 64
    before = logits(model, x)
    report = kh.kernelize_report(kh.kernelize(model))
    assert not report.replaced and not report.kept
    assert "no Mixture-of-Experts" in str(report)
    assert torch.equal(logits(model, x), before)
    assert kh.restore(model) is False


def test_unknown_layer_kind_is_one_line_error():
    model = tiny.tiny_model("olmoe")
    with pytest.raises(KernelHubError, match="unknown layer kind 'attention_sink'") as info:
        kh.kernelize(model, mapping={"attention_sink": "kernel-hub/ragged-dot-tpu"})
    assert "\n" not in str(info.value)
    assert model.get_experts_implementation() == {"": "grouped_mm"}


def test_kernel_failing_validation_is_kept(kernel):
    model = tiny.tiny_model("qwen3_moe")
    x = ids(4)
    before = logits(model, x)

    def wrong(*args, **kwargs):
        return kernel.moe_experts(*args, **kwargs) * 1.01  # 1% off: far outside f32 tolerance

    spy = Spy(kernel, moe=wrong)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"moe_experts": spy}))
    assert not report.replaced and len(report.kept) == 2
    assert all(k.reason.startswith("validation failed: max error 1.0") for k in report.kept)
    calls = spy.calls
    assert torch.equal(logits(model, x), before)
    assert spy.calls == calls
    assert model.get_experts_implementation() == {"": "grouped_mm"}


def test_one_bad_layer_keeps_only_that_layer(kernel):
    model = tiny.tiny_model("mixtral")
    x = ids(5)
    before = logits(model, x)
    bad = model.model.layers[1].mlp.experts

    def sometimes_wrong(hidden, index, weights, gate_up, *args, **kwargs):
        out = kernel.moe_experts(hidden, index, weights, gate_up, *args, **kwargs)
        return out + 1.0 if gate_up is bad.gate_up_proj else out

    report = kh.kernelize_report(kh.kernelize(model, mapping={"moe_experts": Spy(kernel, moe=sometimes_wrong)}))
    assert [r.layer for r in report.replaced] == ["model.layers.0.mlp.experts"]
    assert [k.layer for k in report.kept] == ["model.layers.1.mlp.experts"]
    assert rel(logits(model, x), before) <= 1e-4  # the kept layer runs its default (grouped_mm)
    kh.restore(model)
    assert torch.equal(logits(model, x), before)


def test_kernel_that_does_not_load_leaves_defaults():
    model = tiny.tiny_model("qwen2_moe")
    x = ids(6)
    before = logits(model, x)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"moe_experts": "kernel-hub/no-such-kernel"}))
    assert not report.replaced and len(report.kept) == 2
    assert all("kernel-hub/no-such-kernel did not load" in k.reason for k in report.kept)
    assert torch.equal(logits(model, x), before)


def test_kernel_raising_in_validation_is_kept(kernel):
    def boom(*args, **kwargs):
        raise RuntimeError("no luck")

    model = tiny.tiny_model("olmoe")
    report = kh.kernelize_report(kh.kernelize(model, mapping={"moe_experts": Spy(kernel, moe=boom)}))
    assert not report.replaced
    assert all("kernel raised in validation: RuntimeError: no luck" in k.reason for k in report.kept)


def test_exception_mid_kernelize_restores(monkeypatch):
    model = tiny.tiny_model("qwen3_moe")
    x = ids(7)
    before = logits(model, x)

    def broken(self, name):
        raise RuntimeError("switch failed")

    monkeypatch.setattr(type(model), "set_experts_implementation", broken)
    with pytest.raises(RuntimeError, match="switch failed"):
        kh.kernelize(model)
    monkeypatch.undo()
    assert not any("_kernel_hub_experts" in m.__dict__ for m in model.modules())
    assert "_kernel_hub_state" not in model.__dict__
    assert model.get_experts_implementation() == {"": "grouped_mm"}
    assert torch.equal(logits(model, x), before)


def test_forward_route_when_model_does_not_switch(monkeypatch, kernel):
    """A model whose switch does not reach its expert blocks gets instance forwards instead."""
    model = tiny.tiny_model("olmoe")
    x = ids(8)
    before = logits(model, x)
    monkeypatch.setattr(type(model), "set_experts_implementation", lambda self, name: None)
    spy = Spy(kernel)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"moe_experts": spy}))
    experts = model.model.layers[0].mlp.experts
    assert "forward" in experts.__dict__
    calls = spy.calls
    assert rel(logits(model, x), before) <= 1e-4
    assert spy.calls == calls + 2 and len(report.replaced) == 2
    kh.restore(model)
    assert "forward" not in experts.__dict__
    assert torch.equal(logits(model, x), before)


class PlainExperts(torch.nn.Module):
    """An expert block outside transformers' interface: [E,2I,H] gate-first, like Step3p7's."""

    def __init__(self, e=4, h=12, i=5):
        super().__init__()
        g = torch.Generator().manual_seed(9)
        self.hidden_size = h
        self.gate_up_proj = torch.nn.Parameter(torch.randn(e, 2 * i, h, generator=g) / 3)
        self.down_proj = torch.nn.Parameter(torch.randn(e, h, i, generator=g) / 3)
        self.act_fn = torch.nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for t in range(hidden_states.shape[0]):
            for j, e in enumerate(top_k_index[t].tolist()):
                g, u = torch.nn.functional.linear(hidden_states[t], self.gate_up_proj[e]).chunk(2)
                out[t] += top_k_weights[t, j] * torch.nn.functional.linear(self.act_fn(g) * u, self.down_proj[e])
        return out


class SortedOnlyExperts(PlainExperts):
    def forward(self, hidden_states):  # Llama4-style: another contract
        return hidden_states


class Block(torch.nn.Module):
    def __init__(self, experts):
        super().__init__()
        self.experts = experts

    def forward(self, x, idx, w):
        return self.experts(x, idx, w)


def test_plain_module_gets_checked_forward_replacement(kernel):
    block = Block(PlainExperts())
    g = torch.Generator().manual_seed(10)
    x = torch.randn(6, 12, generator=g)
    idx = torch.argsort(torch.rand(6, 4, generator=g), 1)[:, :2]
    w = torch.rand(6, 2, generator=g)
    with torch.no_grad():
        before = block(x, idx, w)
    spy = Spy(kernel)
    report = kh.kernelize_report(kh.kernelize(block, mapping={"moe_experts": spy}))
    assert [(r.layer, r.route) for r in report.replaced] == [("experts", "forward")]
    with torch.no_grad():
        after = block(x, top_k_index=idx, top_k_weights=w) if False else block(x, idx, w)
        kw = block.experts(x, top_k_index=idx, top_k_weights=w)  # keywords bind like the original
    assert spy.calls >= 2
    assert rel(after, before) <= 1e-5 and rel(kw, before) <= 1e-5
    kh.restore(block)
    assert "forward" not in block.experts.__dict__
    with torch.no_grad():
        assert torch.equal(block(x, idx, w), before)


def test_other_contract_is_kept_with_reason():
    report = kh.kernelize_report(kh.kernelize(Block(SortedOnlyExperts())))
    assert not report.replaced
    assert report.kept[0].reason == "forward(hidden_states) does not take (hidden_states, top_k_index, top_k_weights)"


def test_deepcopy_of_kernelized_model_runs_its_own_weights(kernel):
    model = tiny.tiny_model("qwen3_moe")
    kh.kernelize(model)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            p.mul_(0.5)
    x = ids(11)
    assert not torch.equal(logits(clone, x), logits(model, x))
    kh.restore(clone)
    assert clone.get_experts_implementation() == {"": "grouped_mm"}


def test_bad_mode_and_mapping_value():
    model = tiny.tiny_model("olmoe")
    with pytest.raises(KernelHubError, match="mode must be one of"):
        kh.kernelize(model, mode="serving")
    with pytest.raises(KernelHubError, match="must be a repo id"):
        kh.kernelize(model, mapping={"moe_experts": 42})
    report = kh.kernelize_report(kh.kernelize(model, mapping={"moe_experts": None}))
    assert not report.replaced and all("no kernel mapped" in k.reason for k in report.kept)


def test_kernelize_returns_the_model_and_keeps_its_report():
    model = tiny.tiny_model("qwen3_moe")
    with pytest.raises(kh.KernelHubError, match="never kernelized"):
        kh.kernelize_report(model)
    x = ids(1)
    before = logits(model, x)
    same = kh.kernelize(model)
    assert same is model  # HF kernels' habit: model = kernelize(model)
    report = kh.kernelize_report(model)
    assert report.replaced and report.model == type(model).__name__
    kh.restore(model)
    assert kh.kernelize_report(model) is report  # still readable after restore
    assert torch.equal(logits(model, x), before)
    with pytest.raises(kh.KernelHubError, match="never kernelized"):
        kh.kernelize_report(tiny.tiny_model("qwen3_moe"))
