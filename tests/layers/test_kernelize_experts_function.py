"""kernelize takes any kernel in transformers' experts-function convention: a kernel folder whose torch build exports
only `experts_forward(self, hidden_states, top_k_index, top_k_weights)` (nothing of kernel-hub's contract) serves the
moe_experts kind, checked on each block's own shapes against the block's own implementation, reported with its
repo, variant and the convention it ran through, and restored bit for bit; a wrong one is kept with the numbers."""

from __future__ import annotations

import textwrap
import types
from pathlib import Path

import pytest
import torch

import kernel_hub as kh
from kernel_hub.errors import KernelHubError
from kernel_hub.layers.kinds.experts.plan import experts_convention
from tests.tiny_models import tiny_model

#: A third party's experts function, written out here: a per-expert loop over the module's own weights, reading the
#: layout transformers' use_experts_implementation records on the module (never kernel-hub code).
EXPERTS_FN = '''
import torch

SCALE = {scale}


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    out = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    num_experts = (self.gate_up_proj if self.has_gate else self.up_proj).shape[0]
    for e in range(num_experts):
        token, slot = torch.where(top_k_index == e)
        if token.numel() == 0:
            continue
        x = hidden_states[token]
        w_up = (self.gate_up_proj if self.has_gate else self.up_proj)[e]
        h = x @ w_up if self.is_transposed else x @ w_up.T
        if self.has_bias:
            h = h + (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias)[e]
        h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
        y = h @ self.down_proj[e] if self.is_transposed else h @ self.down_proj[e].T
        if self.has_bias:
            y = y + self.down_proj_bias[e]
        out.index_add_(0, token, (y * top_k_weights[token, slot, None]).float())
    return (out * SCALE).to(hidden_states.dtype)
'''


def experts_kernel(root: Path, *, scale: float = 1.0, name: str = "acme_experts") -> Path:
    """A kernel folder (kernel.yaml + package) whose torch-cpu build exports only experts_forward."""
    folder = root / name
    (folder / name).mkdir(parents=True)
    (folder / "kernel.yaml").write_text(textwrap.dedent(f"""\
        name: {name}
        repo_id: acme/{name.replace('_', '-')}
        version: 1.0.0
        description: a third-party experts function in transformers' convention
        python_name: {name}
        variants:
          - name: torch-cpu
            framework: torch
            backend: cpu
            entry: torch_entry.py
            requires: {{torch: ">=2.0"}}
        """))
    (folder / name / "__init__.py").write_text("")
    (folder / name / "torch_entry.py").write_text(EXPERTS_FN.format(scale=scale))
    return folder


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(input_ids=ids).logits


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_a_third_party_experts_function_replaces_every_block_and_restores_bit_for_bit(tmp_path, family) -> None:
    kernel = kh.get_local_kernel(experts_kernel(tmp_path), framework="torch", backend="cpu")
    assert not hasattr(kernel, "ragged_dot") and not hasattr(kernel, "moe_experts")
    assert experts_convention(kernel)[0] == "experts_forward"
    model = tiny_model(family)
    before, state, impl = _logits(model), _state(model), model.get_experts_implementation()
    report = kh.kernelize_report(
        kh.kernelize(model, mapping={"moe_experts": kernel, "attention": None, "rms_norm": None}))
    assert not report.kept and len(report.replaced) == model.config.num_hidden_layers, str(report)
    for row in report.replaced:
        assert row.kind == "moe_experts" and row.convention == "experts_forward"
        assert row.repo_id == "acme/acme-experts" and row.variant == "torch-cpu" and row.version == "1.0.0"
        assert row.implementation == "experts_forward" and row.route == "interface"
        assert row.max_error is not None and row.max_error <= row.tolerance == 1e-4
        assert "not packed" in row.why  # the block's own dense weights: the function reads them
    assert "via experts_forward" in str(report)
    assert model.get_experts_implementation() != impl  # the model dispatches to the kernel's function now
    after = _logits(model)
    err = ((after - before).abs().max() / before.abs().max()).item()
    assert err <= 1e-4  # its own loop: the same numbers up to summation order (bit-equal on some CPUs)
    assert kh.restore(model)
    assert torch.equal(_logits(model), before) and model.get_experts_implementation() == impl
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_a_plain_module_exporting_experts_forward_is_a_kernel_too() -> None:
    namespace: dict = {}
    exec(EXPERTS_FN.format(scale=1.0), namespace)
    module = types.ModuleType("someones_experts")
    module.experts_forward = namespace["experts_forward"]
    model = tiny_model("mixtral")
    report = kh.kernelize_report(
        kh.kernelize(model, mapping={"moe_experts": module, "attention": None, "rms_norm": None}))
    assert len(report.replaced) == 2 and not report.kept
    assert {r.repo_id for r in report.replaced} == {"someones_experts"}
    assert {r.convention for r in report.replaced} == {"experts_forward"}
    kh.restore(model)


def test_a_wrong_experts_function_is_kept_with_the_numeric_reason(tmp_path) -> None:
    kernel = kh.get_local_kernel(experts_kernel(tmp_path, scale=1.05, name="off_by_5pc"), framework="torch",
                                 backend="cpu")
    model = tiny_model("qwen3_moe")
    before, impl = _logits(model), model.get_experts_implementation()
    report = kh.kernelize_report(
        kh.kernelize(model, mapping={"moe_experts": kernel, "attention": None, "rms_norm": None}))
    assert not report.replaced and len(report.kept) == 2
    for row in report.kept:
        # 5% too large: relative error 0.05 of the block's largest output, over float32's 1e-4
        assert row.reason.startswith("validation failed: max error 5.0") and "> tolerance 1e-04" in row.reason, row
    assert not kh.layers.is_kernelized(model) and model.get_experts_implementation() == impl
    assert torch.equal(_logits(model), before)


def test_an_experts_function_the_convention_cannot_call_is_refused_before_anything_changes() -> None:
    needs_more = types.ModuleType("needs_more")
    needs_more.experts_forward = lambda self, hidden_states, top_k_index, top_k_weights, *, mesh: hidden_states
    nothing = types.ModuleType("nothing")
    model = tiny_model("qwen3_moe")
    for module, words in ((needs_more, "requires keyword parameter(s) mesh"),
                          (nothing, "exports none of moe_experts, ragged_dot, experts_forward")):
        with pytest.raises(KernelHubError, match="mapping\\['moe_experts'\\]") as info:
            kh.kernelize(model, mapping={"moe_experts": module})
        assert words in str(info.value)
        assert not kh.layers.is_kernelized(model)


def test_a_block_without_transformers_layout_is_kept_by_an_experts_function(tmp_path) -> None:
    """A block outside ExpertsInterface (no use_experts_implementation flags) is kept with the reason: the function
    would read attributes the block does not have."""
    kernel = kh.get_local_kernel(experts_kernel(tmp_path), framework="torch", backend="cpu")
    model = tiny_model("qwen3_moe")
    for layer in model.model.layers:
        del layer.mlp.experts.has_bias  # as a hand-written experts class would lack it
    report = kh.kernelize_report(
        kh.kernelize(model, mapping={"moe_experts": kernel, "attention": None, "rms_norm": None}))
    assert not report.replaced and len(report.kept) == 2
    assert all("has no has_bias" in k.reason and "experts_forward" in k.reason for k in report.kept), report.kept


def test_quantize_leaves_an_experts_function_block_unquantized_and_says_why(tmp_path) -> None:
    """quantize= hands quantized copies to kernel-hub's moe_experts contract; an experts_forward kernel reads the
    block's own weights, so each row says it was not quantized, and the numbers are the unquantized ones."""
    kernel = kh.get_local_kernel(experts_kernel(tmp_path), framework="torch", backend="cpu")
    model = tiny_model("qwen3_moe")
    before = _logits(model)
    report = kh.kernelize_report(
        kh.kernelize(model, mapping={"moe_experts": kernel, "attention": None, "rms_norm": None},
                          quantize="int8"))
    assert len(report.replaced) == 2 and not report.kept
    for row in report.replaced:
        assert row.quantized is None and "not quantized: the kernel exports no quantize, moe_experts" in row.why
    assert ((_logits(model) - before).abs().max() / before.abs().max()).item() <= 1e-4
    kh.restore(model)
