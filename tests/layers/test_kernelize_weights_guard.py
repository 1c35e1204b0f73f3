"""kernelize never lets a kernel change the model's weights, and holds a kernel's output to the layer's dtype and shape.

Hostile kernels wrap the real ones: they write to the weights they are given before or after computing (in place, or
through `.data`, which bypasses autograd's version counter), return float64 from a float32 layer, or behave in
validation and write at run time. Every kind (moe_experts, attention, rms_norm) and the Diffusers attention path is
checked: the layer is kept with the reason, its weights are bit-identical to before kernelize (compared as raw
bytes, independently of the guard's own comparison), logits do not move; a write at run time raises. A model still
on the meta device gets one error saying to load the weights first.
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.errors import KernelHubError  # noqa: E402
from kernel_hub.layers import is_kernelized  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

OFF = {"moe_experts": None, "attention": None, "rms_norm": None}


@pytest.fixture(scope="module")
def fa():
    return kh.get_kernel("kernel-hub/flash-attention-tpu", framework="torch", backend="cpu")


@pytest.fixture(scope="module")
def rn():
    return kh.get_kernel("kernel-hub/rms-norm-tpu", framework="torch", backend="cpu")


def raw(model):
    """Every parameter and buffer as (object id, raw bytes): what 'bit-identical' means here."""
    out = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        out[name] = (id(t), t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).clone())
    return out


def same_raw(a, b):
    return a.keys() == b.keys() and all(a[k][0] == b[k][0] and torch.equal(a[k][1], b[k][1]) for k in a)


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits


def ids():
    return torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(0))


def experts_kernel(rd, moe):
    return types.SimpleNamespace(__kernel_hub__=rd.__kernel_hub__, describe=rd.describe, ragged_dot=rd.ragged_dot,
                                 moe_experts=moe)


def _pre(rd):
    def moe(h, i, w, up, down, **kw):
        up.data.mul_(0.5)  # `.data`: no version bump, only the content check sees it
        return rd.moe_experts(h, i, w, up, down, **kw)
    return moe


def _post(rd):
    def moe(h, i, w, up, down, **kw):
        out = rd.moe_experts(h, i, w, up, down, **kw)
        with torch.no_grad():
            down.mul_(0.5)
        return out
    return moe


def _f64(rd):
    return lambda *a, **kw: rd.moe_experts(*a, **kw).to(torch.float64)


@pytest.mark.parametrize(("make", "reason"), [
    (_pre, "the kernel modified the layer's weights gate_up_proj"),
    (_post, "the kernel modified the layer's weights down_proj"),
    (_f64, "the kernel returned float64 [16, {h}]; the block returns float32 [16, {h}]"),
], ids=["writes-before", "writes-after", "float64"])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_experts_kernel_touching_weights_or_dtype_is_kept_and_weights_bit_identical(rd, make, reason, mode):
    model = tiny.tiny_model("qwen3_moe", dtype=torch.float32)
    if mode == "training":
        model.train()
    x = ids()
    before, weights = logits(model.eval(), x), raw(model)
    if mode == "training":
        model.train()
    report = kh.kernelize_report(
        kh.kernelize(model, mode=mode, mapping={**OFF, "moe_experts": experts_kernel(rd, make(rd))}))
    experts = [n for n, m in model.named_modules() if type(m).__name__.endswith("Experts")]
    assert not report.replaced and [k.layer for k in report.kept] == experts
    reason = reason.format(h=model.config.hidden_size)
    assert all(k.reason == reason for k in report.kept), report.kept
    assert same_raw(raw(model), weights)  # put back bit for bit (and the very same parameter objects)
    assert not is_kernelized(model) and kh.restore(model) is False
    assert torch.equal(logits(model.eval(), x), before)


def test_experts_kernel_writing_at_run_time_raises(rd):
    model = tiny.tiny_model("qwen3_moe", dtype=torch.float32)
    armed = {"on": False}

    def moe(h, i, w, up, down, **kw):
        out = rd.moe_experts(h, i, w, up, down, **kw)
        if armed["on"]:
            with torch.no_grad():
                down.mul_(0.5)
        return out

    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "moe_experts": experts_kernel(rd, moe)}))
    assert report.replaced and not report.kept
    x = ids()
    logits(model, x)  # a well-behaved call passes the guard
    armed["on"] = True
    with pytest.raises(KernelHubError, match=r"modified the layer's weights down_proj at run time"):
        logits(model, x)
    assert kh.restore(model) is True


def test_replaced_experts_restore_bit_identical(rd):
    model = tiny.tiny_model("qwen3_moe", dtype=torch.float32)
    x = ids()
    before, weights = logits(model, x), raw(model)
    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "moe_experts": rd}))
    assert report.replaced and not report.kept
    logits(model, x)
    assert kh.restore(model) is True
    assert same_raw(raw(model), weights) and torch.equal(logits(model, x), before)


def norm_kernel(rn, fn):
    return types.SimpleNamespace(__kernel_hub__=rn.__kernel_hub__, describe=getattr(rn, "describe", None),
                                 rms_norm=fn)


def norms(model):
    return [n for n, m in model.named_modules() if type(m).__name__.endswith("RMSNorm")]


def test_rms_norm_kernel_touching_weight_or_dtype_is_kept(rn):
    model = tiny.tiny_model("qwen3_moe", dtype=torch.float32)
    x = ids()
    before, weights = logits(model, x), raw(model)

    def writes(x, weight, **kw):
        weight.data.add_(1.0)
        return rn.rms_norm(x, weight, **kw)

    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "rms_norm": norm_kernel(rn, writes)}))
    kept = [k for k in report.kept if k.kind == "rms_norm"]
    assert not report.replaced and len(kept) == len(norms(model))
    assert all(k.reason == "the kernel modified the layer's weights weight" for k in kept), kept
    assert same_raw(raw(model), weights) and torch.equal(logits(model, x), before)

    f64 = norm_kernel(rn, lambda x, weight, **kw: rn.rms_norm(x, weight, **kw).double())
    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "rms_norm": f64}))
    kept = [k for k in report.kept if k.kind == "rms_norm"]
    assert not report.replaced and len(kept) == len(norms(model))
    assert all(k.reason.startswith("the kernel returned float64 [16, ") and "the layer returns float32" in k.reason
               for k in kept), kept
    assert torch.equal(logits(model, x), before)


def test_rms_norm_kernel_writing_at_run_time_raises(rn):
    model = tiny.tiny_model("qwen3_moe", dtype=torch.float32)
    armed = {"on": False}

    def fn(x, weight, **kw):
        if armed["on"]:
            with torch.no_grad():
                weight.add_(1.0)
        return rn.rms_norm(x, weight, **kw)

    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "rms_norm": norm_kernel(rn, fn)}))
    assert report.replaced
    armed["on"] = True
    with pytest.raises(KernelHubError, match=r"weights weight at run time"):
        logits(model, ids())


def attention_kernel(fa, fn):
    return types.SimpleNamespace(__kernel_hub__=fa.__kernel_hub__, describe=fa.describe, flash_attention=fn)


def test_attention_kernel_touching_weights_or_dtype_is_kept(fa):
    model = tiny.llama(torch.float32)
    x = ids()
    before, weights = logits(model, x), raw(model)
    layers = [m for _, m in model.named_modules() if type(m).__name__.endswith("Attention")]
    calls = {"n": 0}

    def writes(*a, **kw):  # calls come layer by layer: each writes to the o_proj of the layer it serves
        layers[calls["n"] % len(layers)].o_proj.weight.data.mul_(0.5)
        calls["n"] += 1
        return fa.flash_attention(*a, **kw)

    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "attention": attention_kernel(fa, writes)}))
    assert calls["n"] >= len(layers) and not report.replaced and len(report.kept) == len(layers)
    assert all(k.reason == "the kernel modified the layer's weights o_proj.weight" for k in report.kept), report.kept
    assert same_raw(raw(model), weights) and torch.equal(logits(model, x), before)

    f64 = attention_kernel(fa, lambda *a, **kw: fa.flash_attention(*a, **kw).double())
    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "attention": f64}))
    assert not report.replaced and len(report.kept) == len(layers)
    assert all(k.reason.startswith("the kernel returned float64 [") and "attention returns float32" in k.reason
               for k in report.kept), report.kept
    assert torch.equal(logits(model, x), before)


def test_diffusers_attention_kernel_touching_weights_or_dtype_is_kept(fa):
    pytest.importorskip("diffusers")
    from kernel_hub.report import models

    model, inputs = models.diffusers_model("flux", torch.float32)
    paths = [p for p, m in model.named_modules() if hasattr(m, "set_processor")]
    weights = raw(model)
    with torch.no_grad():
        before = model(**inputs, return_dict=False)[0]
    current = {"module": None}
    for p in paths:  # the module each kernel call serves, for the hostile kernel below
        model.get_submodule(p).register_forward_pre_hook(lambda m, *_: current.__setitem__("module", m))

    def writes(*a, **kw):
        current["module"].to_q.weight.data.mul_(0.5)
        return fa.flash_attention(*a, **kw)

    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "attention": attention_kernel(fa, writes)}))
    assert not report.replaced and [k.layer for k in report.kept] == paths
    assert all(k.reason == "the kernel modified the layer's weights to_q.weight" for k in report.kept), report.kept
    f64 = attention_kernel(fa, lambda *a, **kw: fa.flash_attention(*a, **kw).double())
    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "attention": f64}))
    assert not report.replaced and all(k.reason.startswith("the kernel returned float64") for k in report.kept)
    assert same_raw(raw(model), weights)
    with torch.no_grad():
        assert torch.equal(model(**inputs, return_dict=False)[0], before)


def test_model_on_meta_device_says_load_the_weights_first(rd):
    model = tiny.tiny_model("qwen3_moe", dtype=torch.float32).to("meta")
    with pytest.raises(KernelHubError, match=r"on the meta device .*load the weights first"):
        kh.kernelize(model)
    with pytest.raises(KernelHubError, match=r"load the weights first"):
        kh.kernelize(model, mapping={**OFF, "moe_experts": rd}, validate=False)
    assert not is_kernelized(model)


def test_held_weights_puts_back_every_kind_of_change():
    from kernel_hub.layers.weights_guard import WeightsModified, held_weights

    m = torch.nn.Linear(4, 3)
    m.register_buffer("stat", torch.tensor([float("nan"), -0.0, 1.0]))
    weight, wstore = m.weight, m.weight.data
    before = raw(m)
    with held_weights(m):  # NaN and -0.0 read back as themselves: nothing changed, nothing raised
        pass
    for change, name in [
        (lambda: setattr(m.weight, "data", torch.zeros(3, 4)), "weight"),  # new storage under the same object
        (lambda: m.__setattr__("bias", torch.nn.Parameter(torch.zeros(3))), "bias"),  # another object
        (lambda: m.stat.data.copy_(torch.tensor([0.0, 0.0, 1.0])), "stat"),  # NaN -> 0 and -0.0 -> 0.0
        (lambda: m.register_buffer("extra", torch.ones(1)), "extra"),  # something added
    ]:
        with pytest.raises(WeightsModified, match=f"weights {name}$"), held_weights(m):
            change()
        assert same_raw(raw(m), before) and m.weight is weight and m.weight.data.data_ptr() == wstore.data_ptr()
    with pytest.raises(WeightsModified), held_weights(m):  # the weights are said first, even when the body raised
        m.weight.data.zero_()
        raise RuntimeError("and then failed")
    assert same_raw(raw(m), before)


def test_run_time_watch_sees_in_place_writes_and_swaps():
    from kernel_hub.layers.weights_guard import WeightsModified, versions, watched

    m = torch.nn.Linear(4, 3)
    v = versions(m)
    with watched(m):
        m(torch.ones(2, 4))  # reading is fine
    assert versions(m) == v
    with pytest.raises(WeightsModified, match="weights bias at run time"), watched(m), torch.no_grad():
        m.bias.add_(1.0)
    with pytest.raises(WeightsModified, match="weights weight at run time"), watched(m):
        m.weight.data = torch.zeros(3, 4)


def _outside_writes(model, how):
    """A moe kernel that, on its first call of each validation, writes to a weight outside the block it serves (the
    shared-expert gate of layer 0 and the final norm) in place or through `.data`, then computes honestly."""
    targets = [model.model.layers[0].mlp.shared_expert_gate.weight, model.model.norm.weight]

    def write():
        for t in targets:
            if how == "in-place":
                with torch.no_grad():
                    t.mul_(0.5)
            else:
                t.data.add_(1.0)
    return write


@pytest.mark.parametrize("how", ["in-place", "data"])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_experts_kernel_writing_outside_its_block_is_kept_and_model_bit_identical(rd, how, mode):
    model = tiny.tiny_model("qwen2_moe", dtype=torch.float32)
    x = ids()
    before, weights = logits(model, x), raw(model)
    write = _outside_writes(model, how)

    def moe(h, i, w, up, down, **kw):
        write()
        return rd.moe_experts(h, i, w, up, down, **kw)

    if mode == "training":
        model.train()
    report = kh.kernelize_report(
        kh.kernelize(model, mode=mode, mapping={**OFF, "moe_experts": experts_kernel(rd, moe)}))
    experts = [n for n, m in model.named_modules() if type(m).__name__.endswith("Experts")]
    assert not report.replaced and [k.layer for k in report.kept] == experts
    want = ("the kernel modified weights outside the layer model.layers.0.mlp.shared_expert_gate.weight, "
            "model.norm.weight")
    assert all(k.reason == want for k in report.kept), report.kept
    assert same_raw(raw(model), weights)
    assert torch.equal(logits(model.eval(), x), before)


def test_experts_kernel_overwriting_its_hidden_states_is_kept(rd):
    model = tiny.tiny_model("qwen2_moe", dtype=torch.float32)
    x = ids()
    before, weights = logits(model, x), raw(model)

    def moe(h, i, w, up, down, **kw):
        out = rd.moe_experts(h, i, w, up, down, **kw)
        h.mul_(0.0)  # the shared-expert gate reads the hidden states after the experts ran
        return out

    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "moe_experts": experts_kernel(rd, moe)}))
    assert not report.replaced and report.kept
    assert all(k.reason == "the kernel modified its input hidden_states (a kernel writes only its output)"
               for k in report.kept), report.kept
    assert same_raw(raw(model), weights) and torch.equal(logits(model, x), before)


def test_version_bump_without_changed_bits_is_no_false_alarm(rd):
    model = tiny.tiny_model("qwen2_moe", dtype=torch.float32)
    gate = model.model.layers[0].mlp.shared_expert_gate.weight

    def moe(h, i, w, up, down, **kw):
        with torch.no_grad():
            up.add_(0.0)  # the block's own weight: version moves, bits do not
            gate.mul_(1.0)  # a weight outside the block: the same
        return rd.moe_experts(h, i, w, up, down, **kw)

    v = gate._version
    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "moe_experts": experts_kernel(rd, moe)}))
    assert gate._version > v  # the kernel did run its no-op writes
    assert report.replaced and not report.kept, report.kept


def test_attention_kernel_writing_its_query_or_another_layer_is_kept(fa):
    model = tiny.llama(torch.float32)
    x = ids()
    before, weights = logits(model, x), raw(model)
    other = model.model.embed_tokens.weight

    def writes_query(q, *a, **kw):
        out = fa.flash_attention(q, *a, **kw)
        q.mul_(2.0)
        return out

    def writes_embedding(*a, **kw):
        other.data[0].add_(1.0)
        return fa.flash_attention(*a, **kw)

    for fn, want in [(writes_query, "the kernel modified its input query (a kernel writes only its output)"),
                     (writes_embedding, "the kernel modified weights outside the layer model.embed_tokens.weight")]:
        report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "attention": attention_kernel(fa, fn)}))
        assert not report.replaced and report.kept
        assert all(k.reason == want for k in report.kept), report.kept
        assert same_raw(raw(model), weights) and torch.equal(logits(model, x), before)
