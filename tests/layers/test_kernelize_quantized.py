"""kernelize(model, quantize="int8" | "fp8") on tiny bfloat16 Qwen3-MoE, Mixtral and GPT-OSS (biases, interleaved
gate/up, clamped SwiGLU), and on a fine-grained FP8 model's own float8 weights.

Checked: every expert block reads quantized copies (the quantized ragged dot counted), each within the bound
layers/quantize.py derives against its own bf16 layer, with its bytes before and after; the model's parameters,
state_dict and, after restore, its logits are bit for bit what they were; a parameter loaded later is quantized again;
a block over its bound keeps the unquantized kernel; training mode and unknown formats are refused before anything
changes. The kernel's numbers themselves are held to float64 in kernels/pallas/ragged_dot/tests/test_quantized_torch.py.
"""

from __future__ import annotations

import json
import sys
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.errors import KernelHubError  # noqa: E402
from kernel_hub.layers.kinds.experts import quantize as qz  # noqa: E402
from kernel_hub.layers.kinds.experts import transformers as ex  # noqa: E402
from kernel_hub.verify.numerics import relative_error  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

pytestmark = pytest.mark.usefixtures("experts_only")
FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss")


@pytest.fixture
def counted(rd, monkeypatch):
    """Grouped products the kernel ran on quantized weights, by weight dtype (both of its routes go through
    torch_cpu/quantized_ragged_dot.py grouped_matmul_quantized)."""
    calls: list[torch.dtype] = []
    module = sys.modules[f"{rd.__name__}.torch_cpu.quantized_ragged_dot"]
    real = module.grouped_matmul_quantized

    def spy(lhs, rhs, rhs_scale, sizes, **kwargs):
        calls.append(rhs.dtype)
        return real(lhs, rhs, rhs_scale, sizes, **kwargs)

    monkeypatch.setattr(module, "grouped_matmul_quantized", spy)
    return calls


def ids(seed=0):
    return torch.randint(3, 120, (2, 9), generator=torch.Generator().manual_seed(seed))


def logits(model, seed=0):
    with torch.no_grad():
        return model(ids(seed)).logits


def expert_rows(report):
    return [r for r in report.replaced if r.kind == "moe_experts"]


@pytest.mark.parametrize("fmt", list(qz.FORMATS))
@pytest.mark.parametrize("family", FAMILIES)
def test_quantized_experts_within_their_bound_and_the_model_given_back_bit_for_bit(family, fmt, counted):
    model = tiny.tiny_model(family, dtype=torch.bfloat16)
    params = {name: p for name, p in model.named_parameters()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = logits(model)

    report = kh.kernelize_report(kh.kernelize(model, quantize=fmt))
    rows = expert_rows(report)
    assert len(rows) == 2 and not report.kept, str(report)
    for row in rows:
        assert row.quantized == qz.DESCRIBE[fmt]
        assert row.max_error is not None and row.tolerance is not None and row.max_error <= row.tolerance
        assert row.tolerance <= (0.07 if fmt == "int8" else 0.25)  # the bound, a priori (quantize.py docstring)
        assert row.bytes_after < 0.6 * row.bytes_before  # 1 byte a weight + float32 scales, against 2
    text, data = str(report), json.loads(report.to_json())
    assert "quantized expert weights:" in text and f"{rows[0].bytes_before:,}" in text
    assert data["replaced"][0]["bytes_after"] == rows[0].bytes_after

    counted.clear()
    logits(model)
    assert set(counted) == {qz.FORMATS[fmt]} and len(counted) == 4  # two layers, two projections each
    # Each block on fresh inputs (not kernelize's validation batch) stays within its bound against its own bf16
    # layer, run after restore. (Whole-model logits are no measure: a router whose top-k flips on a 1% change
    # sends a token to other experts.)
    batches = {row.layer: block_batch(model.get_submodule(row.layer), seed=100 + i) for i, row in enumerate(rows)}
    with torch.no_grad():
        quantized = {path: model.get_submodule(path)(*batch) for path, batch in batches.items()}

    # the model's own parameters are untouched: same objects, same bytes, same state_dict
    assert all(p is params[name] for name, p in model.named_parameters())
    now = model.state_dict()
    assert list(now) == list(state) and all(torch.equal(now[k], state[k]) for k in state)

    assert kh.restore(model)
    assert not any(qz.RECORD_ATTR in m.__dict__ or ex.HOOK_ATTR in m.__dict__ for m in model.modules())
    assert torch.equal(logits(model), before)
    with torch.no_grad():
        for row in rows:
            own = model.get_submodule(row.layer)(*batches[row.layer])
            assert 0 < relative_error(quantized[row.layer], own) <= row.tolerance


def block_batch(block, seed, tokens=32):
    """Random hidden states, distinct top-k expert ids and softmax weights for one expert block."""
    g = torch.Generator().manual_seed(seed)
    experts = block.gate_up_proj.shape[0]
    hidden = torch.randn(tokens, block.config.hidden_size, generator=g).to(torch.bfloat16)
    index = torch.argsort(torch.rand(tokens, experts, generator=g), dim=1)[:, :2]
    weights = torch.softmax(torch.randn(tokens, 2, generator=g), dim=-1).to(torch.bfloat16)
    return hidden, index, weights


def test_a_parameter_loaded_after_kernelize_is_quantized_again(counted):
    model = tiny.tiny_model("mixtral", dtype=torch.bfloat16)
    other = tiny.tiny_model("mixtral", dtype=torch.bfloat16, seed=1)
    kh.kernelize(model, quantize="int8")
    model.load_state_dict(other.state_dict())
    kh.kernelize(other, quantize="int8")
    assert torch.equal(logits(model), logits(other))  # quantized from the new weights, the same way
    assert counted


def test_a_block_over_its_bound_keeps_the_unquantized_kernel(monkeypatch, counted):
    model = tiny.tiny_model("qwen3_moe", dtype=torch.bfloat16)
    plain = tiny.tiny_model("qwen3_moe", dtype=torch.bfloat16)
    kh.kernelize(plain)
    monkeypatch.setattr(qz, "error_bound", lambda *a, **k: 0.0)
    report = kh.kernelize_report(kh.kernelize(model, quantize="fp8"))
    rows = expert_rows(report)
    assert rows and all(r.quantized is None and r.why.startswith("not quantized: fp8 error") for r in rows)
    assert not any(qz.RECORD_ATTR in m.__dict__ for m in model.modules())
    counted.clear()
    assert torch.equal(logits(model), logits(plain)) and not counted


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"quantize": "int8", "mode": "training"}, "quantize='int8' is for inference"),
    ({"quantize": "int4"}, "quantize must be None, 'int8' or 'fp8'"),
])
def test_training_and_unknown_formats_are_refused_before_anything_changes(kwargs, message):
    model = tiny.tiny_model("qwen3_moe", dtype=torch.bfloat16)
    with pytest.raises(KernelHubError, match=message):
        kh.kernelize(model, **kwargs)
    assert not kh.layers.api.is_kernelized(model)
    assert model.config._experts_implementation != ex.IMPLEMENTATION_NAME


# --- a fine-grained FP8 model (transformers' FineGrainedFP8Config experts) ----------------------------------------


def test_transformers_builds_no_fp8_experts_on_this_cpu():
    """Why the FP8 model below is assembled by hand: transformers 5.24 refuses on-the-fly FP8 quantization without
    a GPU/XPU, and loads a pre-quantized FP8 checkpoint on CPU dequantized to bf16 (FP8Experts never built)."""
    from transformers import FineGrainedFP8Config
    from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: transformers builds FP8 experts there")
    with pytest.raises(RuntimeError, match="No GPU or XPU found"):
        FineGrainedFP8HfQuantizer(FineGrainedFP8Config(), pre_quantized=False).validate_environment()
    loading = FineGrainedFP8HfQuantizer(FineGrainedFP8Config(), pre_quantized=True)
    loading.validate_environment()
    assert loading.quantization_config.dequantize is True


def fp8_model():
    """A tiny Qwen3-MoE (hidden and expert width 128: transformers' FP8 quantizer only tiles whole 128-blocks) whose
    expert blocks are transformers' FP8Experts, filled by transformers' own Fp8Quantize; plus the same model with
    bf16 experts holding transformers' own dequantization of those weights (float32 math, rounded to bf16 once)."""
    from transformers import FineGrainedFP8Config
    from transformers.integrations import finegrained_fp8 as f8
    from transformers.integrations.moe import use_experts_implementation

    model = tiny.tiny_model("qwen3_moe", dtype=torch.bfloat16, hidden_size=128, moe_intermediate_size=128)
    reference = tiny.tiny_model("qwen3_moe", dtype=torch.bfloat16, hidden_size=128, moe_intermediate_size=128)
    quantizer = f8.Fp8Quantize(types.SimpleNamespace(quantization_config=FineGrainedFP8Config()))
    cls = use_experts_implementation(experts_class=f8.FP8Experts, experts_interface=f8.ALL_FP8_EXPERTS_FUNCTIONS,
                                     has_bias=False, has_gate=True)
    for path, module in list(model.named_modules()):
        if not path.endswith(".experts"):
            continue
        block = cls(config=module.config, block_size=(128, 128)).requires_grad_(False)
        for name in ("gate_up_proj", "down_proj"):
            packed = quantizer._quantize_one(name, getattr(module, name).data)
            getattr(block, name).data = packed[name]
            getattr(block, f"{name}_scale_inv").data = packed[f"{name}_scale_inv"]
            dense = f8._dequantize_fp8_weight(packed[name], packed[f"{name}_scale_inv"], [128, 128], torch.float32)
            getattr(reference.get_submodule(path), name).data = dense.to(torch.bfloat16)
        model.set_submodule(path, block)
    return model, reference


def test_a_fine_grained_fp8_model_runs_on_its_own_float8_weights(counted):
    model, reference = fp8_model()
    weights = {n: (p, p.clone()) for n, p in model.named_parameters() if p.dtype == torch.float8_e4m3fn}
    assert len(weights) == 4
    report = kh.kernelize_report(kh.kernelize(model))
    rows = expert_rows(report)
    assert len(rows) == 2 and not report.kept, str(report)
    for row in rows:
        assert row.quantized == qz.DESCRIBE["fp8-model"] and "fp8-model" in row.layout
        assert row.max_error <= row.tolerance == 1e-2  # the bf16 tolerance against the dequantized reference
        assert row.bytes_after < 0.51 * row.bytes_before
    counted.clear()
    got = logits(model)
    assert set(counted) == {torch.float8_e4m3fn}
    assert relative_error(got, logits(reference)) <= 3e-2  # two layers of bf16 rounding of different weights
    for name, (p, copy) in weights.items():
        assert dict(model.named_parameters())[name] is p and torch.equal(p.view(torch.uint8), copy.view(torch.uint8))
    assert kh.restore(model)
    assert not any(qz.RECORD_ATTR in m.__dict__ for m in model.modules())


@pytest.mark.slow
def test_torch_compile_fullgraph_traces_a_quantized_model():
    """torch.compile(fullgraph=True) on a model kernelized with quantize="int8": no graph break (the quantized
    product is a custom op with a fake implementation; the copies' staleness check runs on eager calls only), and the
    same logits as the eager kernelized model ("aot_eager": dynamo's trace and AOT autograd's fake pass, ~15 s)."""
    model = tiny.tiny_model("qwen3_moe", dtype=torch.bfloat16, num_hidden_layers=1)
    kh.kernelize(model, quantize="int8")
    with torch.no_grad():
        eager = model(ids()).logits
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(ids()).logits
    assert torch.equal(compiled, eager)
