"""kernelize with oneDNN-prepacked expert weights (CPU, inference): same logits as the unpacked kernel path bit for
bit, and the original dense weights back, bit for bit and in their layout, through restore, state_dict, saving,
load_state_dict, deepcopy and .to().

The unpacked path is the reference here (KERNEL_HUB_CPU_PACK=0 on an identical model); test_kernelize.py holds that
path to the models' own implementations, and test_kernelize_packed_kernel.py holds the packed entry to a NumPy
float64 reference.
"""

from __future__ import annotations

import copy
import io
import json
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.layers.kinds.experts import packing, plan  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

pytestmark = pytest.mark.usefixtures("experts_only")


@pytest.fixture(scope="module")
def kernel():
    k = kh.get_kernel("kernel-hub/ragged-dot-tpu", framework="torch", backend="cpu")
    for dtype in (torch.float32, torch.bfloat16):
        ok, why = k.packing_support(dtype)
        if not ok:  # the capability probe says this CPU/torch cannot pack: nothing here applies
            pytest.skip(f"oneDNN packing unavailable here: {why}")
    return k


class Spy(types.SimpleNamespace):
    """The kernel with its packed entry counted, so a test cannot pass with the packed path never running."""

    def __init__(self, kernel):
        super().__init__(calls=0, __kernel_hub__=kernel.__kernel_hub__, ragged_dot=kernel.ragged_dot,
                         describe=kernel.describe, moe_experts=kernel.moe_experts, pack_experts=kernel.pack_experts,
                         packing_support=kernel.packing_support)
        self._packed = kernel.moe_experts_packed

    def moe_experts_packed(self, *args, **kwargs):
        self.calls += 1
        return self._packed(*args, **kwargs)


def frozen(family, dtype=torch.float32, seed=0):
    return tiny.tiny_model(family, dtype=dtype, seed=seed).requires_grad_(False)


def ids(seed=0, batch=2, length=9):
    return torch.randint(3, 120, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(x).logits


def unpacked_logits(model, x, monkeypatch):
    """Logits of `model` kernelized without packing (then restored)."""
    with monkeypatch.context() as m:
        m.setenv(packing.ENV, "0")
        report = kh.kernelize_report(kh.kernelize(model))
    assert report.replaced and not any(packing.record_of(mod) for mod in model.modules())
    out = logits(model, x)
    kh.restore(model)
    return out


def expert_blocks(model):
    return [m for m in model.modules() if packing.record_of(m) is not None]


def dense_snapshot(model):
    return {k: (v.clone(), v.stride()) for k, v in model.state_dict().items()}


def assert_same_weights(state, snapshot, convert=lambda t: t):
    assert list(state) == list(snapshot)  # same keys, same order
    for key, (value, stride) in snapshot.items():
        got = state[key]
        assert got.layout == torch.strided and got.device.type == "cpu", key
        assert got.stride() == stride and got.shape == value.shape, key
        assert torch.equal(got, convert(value)), key


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_packed_logits_identical_to_unpacked(family, dtype, kernel, monkeypatch):
    model = frozen(family, dtype)
    x = ids(3, batch=3, length=11)
    expected = unpacked_logits(model, x, monkeypatch)
    spy = Spy(kernel)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"moe_experts": spy}))
    n = len(report.replaced)
    if family == "gpt_oss" and not onednn_packs(kernel, dtype):  # transposed: oneDNN's route, missing here
        assert n >= 1 and not expert_blocks(model)
        assert all("not packed" in r.why and "oneDNN cannot pack" in r.why for r in report.replaced), str(report)
        assert torch.equal(logits(model, x), expected)  # kernelized, unpacked, the same numbers
        return
    assert n >= 1 and len(expert_blocks(model)) == n
    assert all(r.implementation.startswith("packed experts") and r.why.startswith("packed in place")
               for r in report.replaced)
    calls = spy.calls
    got = logits(model, x)
    assert spy.calls == calls + n  # every block ran the packed entry
    assert torch.equal(got, expected)
    gen = model.generate(x[:1, :4], max_new_tokens=6, do_sample=False)  # decode: one row per expert and call
    kh.restore(model)
    assert torch.equal(gen, model.generate(x[:1, :4], max_new_tokens=6, do_sample=False))


def onednn_packs(kernel, dtype: torch.dtype) -> bool:
    """Whether oneDNN packs `dtype` here (the route of transposed stacks: bfloat16 needs AVX512 or AMX)."""
    import sys

    return sys.modules[kernel.PackedExperts.__module__].onednn_support(dtype)[0]


def test_restore_gives_the_same_parameter_objects_bit_for_bit(kernel):
    dtype = torch.bfloat16 if onednn_packs(kernel, torch.bfloat16) else torch.float32
    model = frozen("gpt_oss", dtype)  # transposed, interleaved, with biases
    snapshot = dense_snapshot(model)
    params = {name: p for name, p in model.named_parameters()}
    order = {name: list(m._parameters) for name, m in model.named_modules()}
    kh.kernelize(model)
    blocks = expert_blocks(model)
    assert blocks
    for block in blocks:  # while packed: meta placeholders, nothing readable as numbers
        assert block.gate_up_proj.device.type == "meta" and block.down_proj.device.type == "meta"
        assert block.gate_up_proj.shape == snapshot["model.layers.0.mlp.experts.gate_up_proj"][0].shape
    assert kh.restore(model) is True
    assert_same_weights(model.state_dict(), snapshot)
    assert all(p is params[name] for name, p in model.named_parameters())  # the same objects
    assert {name: list(m._parameters) for name, m in model.named_modules()} == order
    for block in model.modules():
        assert packing.RECORD_ATTR not in block.__dict__ and "_apply" not in block.__dict__
        assert not block._state_dict_hooks and not block._load_state_dict_pre_hooks


def test_state_dict_and_torch_save_hold_dense_originals(kernel):
    model = frozen("qwen3_moe", torch.bfloat16)
    snapshot = dense_snapshot(model)
    kh.kernelize(model)
    assert expert_blocks(model)
    assert_same_weights(model.state_dict(), snapshot)
    kept = model.state_dict(keep_vars=True)
    key = "model.layers.1.mlp.experts.down_proj"
    assert isinstance(kept[key], torch.nn.Parameter) and torch.equal(kept[key], snapshot[key][0])
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    assert_same_weights(torch.load(buffer, weights_only=True), snapshot)
    x = ids(4)
    fresh = frozen("qwen3_moe", torch.bfloat16, seed=7)
    fresh.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    kh.restore(model)
    assert torch.equal(logits(fresh, x), logits(model, x))


def test_save_pretrained_writes_dense_originals(kernel, tmp_path):
    model = frozen("mixtral", torch.bfloat16)
    snapshot = dense_snapshot(model)
    kh.kernelize(model)
    assert expert_blocks(model)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert_same_weights(loaded.state_dict(), snapshot)
    kh.restore(model)
    assert_same_weights(model.state_dict(), snapshot)


def test_to_float32_unpacks_converts_and_packs_again(kernel, monkeypatch):
    model = frozen("qwen3_moe", torch.bfloat16)
    snapshot = dense_snapshot(model)
    kh.kernelize(model)
    before = [packing.record_of(b).holders for b in expert_blocks(model)]
    model.to(torch.float32)
    assert_same_weights(model.state_dict(), snapshot, convert=lambda t: t.float())
    blocks = expert_blocks(model)
    assert all(packing.record_of(b).holders is not None and packing.record_of(b).holders is not h
               for b, h in zip(blocks, before, strict=True))  # packed again, in float32
    assert all(packing.record_of(b).holders["down_proj"].dtype == torch.float32 for b in blocks)
    x = ids(6)
    got = logits(model, x)
    kh.restore(model)
    assert torch.equal(got, unpacked_logits(model, x, monkeypatch))


def test_to_where_it_already_is_keeps_the_packed_weights(kernel):
    model = frozen("qwen3_moe", torch.bfloat16)
    kh.kernelize(model)
    x = ids(7)
    expected = logits(model, x)
    holders = [packing.record_of(b).holders for b in expert_blocks(model)]
    order = [list(b._parameters) for b in expert_blocks(model)]
    assert model.to("cpu") is model and model.to(torch.bfloat16) is model
    assert [packing.record_of(b).holders for b in expert_blocks(model)] == holders  # not repacked
    assert [list(b._parameters) for b in expert_blocks(model)] == order
    assert torch.equal(logits(model, x), expected)


def test_to_meta_gives_dense_meta_weights_of_the_original_layout(kernel):
    model = frozen("gpt_oss", torch.float32)
    snapshot = dense_snapshot(model)
    kh.kernelize(model)
    model.to("meta")
    for block in model.modules():
        record = packing.record_of(block)
        if record is not None:
            assert record.holders is None  # nothing to pack on meta: unpacked
    state = model.state_dict()
    assert list(state) == list(snapshot)
    for key, (value, stride) in snapshot.items():
        assert state[key].device.type == "meta" and state[key].shape == value.shape
        assert state[key].stride() == stride and state[key].dtype == value.dtype


def test_load_state_dict_into_a_packed_model(kernel, monkeypatch):
    model = frozen("mixtral", torch.bfloat16)
    other = frozen("mixtral", torch.bfloat16, seed=3)
    new = {k: v.clone() for k, v in other.state_dict().items()}
    kh.kernelize(model)
    model.load_state_dict(new)
    assert all(packing.record_of(b).holders is not None for b in expert_blocks(model))  # packed again
    assert_same_weights(model.state_dict(), {k: (v, v.stride()) for k, v in new.items()})
    x = ids(8)
    got = logits(model, x)
    assert torch.equal(got, unpacked_logits(other, x, monkeypatch))


def test_deepcopy_of_a_packed_model(kernel):
    model = frozen("qwen3_moe", torch.float32)
    snapshot = dense_snapshot(model)
    kh.kernelize(model)
    clone = copy.deepcopy(model)
    x = ids(9)
    assert torch.equal(logits(clone, x), logits(model, x))
    for a, b in zip(expert_blocks(model), expert_blocks(clone), strict=True):
        ha, hb = packing.record_of(a).holders, packing.record_of(b).holders
        assert hb is not None and hb["down_proj"].tensor.data_ptr() != ha["down_proj"].tensor.data_ptr()
    kh.restore(clone)
    assert_same_weights(clone.state_dict(), snapshot)
    kh.restore(model)
    assert_same_weights(model.state_dict(), snapshot)


def test_replacing_a_packed_weight_is_seen_by_the_next_call(kernel, monkeypatch):
    model = frozen("qwen3_moe", torch.float32)
    other = frozen("qwen3_moe", torch.float32, seed=5)
    kh.kernelize(model)
    block = model.model.layers[0].mlp.experts
    block.gate_up_proj = torch.nn.Parameter(other.model.layers[0].mlp.experts.gate_up_proj.detach().clone(),
                                            requires_grad=False)
    block.down_proj = torch.nn.Parameter(other.model.layers[0].mlp.experts.down_proj.detach().clone(),
                                         requires_grad=False)
    x = ids(10)
    got = logits(model, x)
    assert packing.record_of(block).holders is None  # dropped its packed copy
    kh.restore(model)
    assert torch.equal(got, unpacked_logits(model, x, monkeypatch))
    assert torch.equal(block.gate_up_proj, other.model.layers[0].mlp.experts.gate_up_proj)


@pytest.mark.parametrize("case", ["training", "requires_grad", "shared", "disabled"])
def test_blocks_that_are_not_packed_say_why(case, kernel, monkeypatch):
    model = tiny.tiny_model("qwen3_moe")  # parameters require grad, as built
    if case != "requires_grad":
        model.requires_grad_(False)
    held = model.state_dict() if case == "shared" else None  # shares the weights' memory
    snapshot = dense_snapshot(model)
    if case == "disabled":
        monkeypatch.setenv(packing.ENV, "0")
    report = kh.kernelize_report(kh.kernelize(model, mode="training" if case == "training" else "inference"))
    expected = {"training": "mode='training'", "requires_grad": "require grad", "shared": "shared with another",
                "disabled": packing.ENV}[case]
    assert report.replaced and all(r.why.startswith("not packed") and expected in r.why for r in report.replaced)
    assert not expert_blocks(model)
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert expected in str(report)
    if held is not None:
        assert_same_weights(held, snapshot)
    kh.restore(model)
    assert_same_weights(model.state_dict(), snapshot)


def test_report_json_has_the_reason(kernel):
    report = kh.kernelize_report(kh.kernelize(frozen("qwen3_moe", torch.bfloat16)))
    data = json.loads(report.to_json())
    assert all("packed in place" in r["why"] and "bfloat16" in r["why"] for r in data["replaced"])
    # what backs the packed bytes, or why ordinary pages (this tiny model's experts hold no whole 2 MiB page)
    assert all("MiB in 2 MiB pages" in r["why"] or "ordinary pages (" in r["why"] for r in data["replaced"])
    assert "why:" in str(report)


def test_packed_path_refuses_inputs_that_need_grad(kernel):
    model = frozen("qwen3_moe", torch.float32)
    model.model.embed_tokens.weight.requires_grad_(True)
    kh.kernelize(model)
    with pytest.raises(RuntimeError, match="inference-only"):
        model(ids(11)).logits.sum().backward()
    with torch.no_grad():
        model(ids(11))


@pytest.mark.parametrize(("mode", "device", "dtype", "grad", "exports", "support", "enabled", "ok", "words"), [
    ("inference", "cpu", "bfloat16", False, True, (True, "probe passed"), True, True, "probe passed"),
    ("training", "cpu", "bfloat16", False, True, (True, "x"), True, False, "mode='training'"),
    ("inference", "cpu", "float32", True, True, (True, "x"), True, False, "require grad"),
    ("inference", "cuda", "float32", False, True, (True, "x"), True, False, "on cuda"),
    ("inference", "cpu", "float32", False, False, None, True, False, "exports no packed-weights entry"),
    ("inference", "cpu", "float16", False, True, (False, "float16 weights: packing covers"), True, False, "float16"),
    ("inference", "cpu", "float32", False, True, (True, "x"), False, False, "disabled"),
])
def test_decide_packing(mode, device, dtype, grad, exports, support, enabled, ok, words):
    packed, why = plan.decide_packing(mode=mode, device_type=device, dtype=dtype, requires_grad=grad,
                                         kernel_exports=exports, support=support, enabled=enabled)
    assert packed is ok and words in why and why.startswith("not packed") is (not ok)


def _status_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def _reset_peak():
    Path("/proc/self/clear_refs").write_text("5")


def test_kernelize_peak_memory_grows_by_at_most_one_expert(kernel):
    """Packing in place: kernelize's peak resident memory grows by less than one layer and one expert: the layer is
    the copy validation holds its weights in while the kernel runs (weights_guard.py), freed before packing; packing
    out of place would add a second whole layer (8 experts here) on top."""
    try:
        _reset_peak()
    except OSError:
        pytest.skip("needs Linux /proc/self/clear_refs to reset the peak resident memory")
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=2048, moe_intermediate_size=512, num_experts=8, num_experts_per_tok=2)
    config._experts_implementation = "grouped_mm"

    def layer():
        torch.manual_seed(0)
        block = torch.nn.Module()
        block.experts = Qwen3MoeExperts(config).to(torch.bfloat16).requires_grad_(False)
        with torch.no_grad():
            for p in block.experts.parameters():
                p.normal_(0.0, 0.02)
        return block

    expert_kib = 3 * 2048 * 512 * 2 / 1024
    warm, block = layer(), layer()
    kh.kernelize(warm)  # one-time costs (imports, oneDNN code, the validation path) out of the measurement
    snapshot = dense_snapshot(block)
    before = _status_kib("VmRSS")
    _reset_peak()
    report = kh.kernelize_report(kh.kernelize(block))
    peak = _status_kib("VmHWM")
    assert report.replaced[0].why.startswith("packed in place")
    layer_kib = 8 * expert_kib  # validation's copy of the block (layers/weights_guard.py)
    assert peak - before < layer_kib + expert_kib, (f"peak grew {(peak - before) / 1024:.1f} MiB, one layer and one "
                                                    f"expert {(layer_kib + expert_kib) / 1024} MiB")
    _reset_peak()
    before = _status_kib("VmRSS")
    kh.restore(block)
    assert _status_kib("VmHWM") - before < expert_kib
    assert_same_weights(block.state_dict(), snapshot)


def test_kernelize_again_on_a_packed_bare_block_repacks(kernel):
    """A block whose only parameters are packed (meta placeholders) is still seen as on the CPU."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
    config._experts_implementation = "grouped_mm"
    container = torch.nn.Module()
    container.experts = Qwen3MoeExperts(config).requires_grad_(False)
    with torch.no_grad():
        for p in container.experts.parameters():
            p.normal_()
    snapshot = dense_snapshot(container)
    assert kh.kernelize_report(kh.kernelize(container)).replaced[0].why.startswith("packed in place")
    for block in (container, copy.deepcopy(container)):
        report = kh.kernelize_report(kh.kernelize(block))
        assert report.backend == "cpu" and report.replaced[0].why.startswith("packed in place")
        kh.restore(block)
        assert_same_weights(block.state_dict(), snapshot)


def test_switching_a_packed_model_to_another_implementation_is_honoured(kernel):
    """The user's later set_experts_implementation wins: the packed blocks are unpacked first (transformers' own
    implementations cannot read packed weights), the chosen one runs with the logits of before kernelize, and the
    model still works switched back (unpacked) and restored."""
    model = frozen("qwen3_moe")
    x = ids()
    before = logits(model, x)
    kh.kernelize(model, mapping={"moe_experts": Spy(kernel)})
    assert expert_blocks(model)
    model.set_experts_implementation("grouped_mm")
    assert not expert_blocks(model)
    assert torch.equal(logits(model, x), before)
    model.set_experts_implementation("kernel_hub")
    assert ((logits(model, x) - before).abs().max() / before.abs().max()).item() <= 1e-4
    kh.restore(model)
    model.set_experts_implementation("grouped_mm")
    assert torch.equal(logits(model, x), before)
