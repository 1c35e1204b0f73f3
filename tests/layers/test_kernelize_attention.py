"""kernelize's attention path on tiny transformers models (dense Llama, Qwen3-MoE, GPT-OSS with sinks and
sliding layers), and the flash-attention kernel's torch entry against its NumPy reference.

The reference for logits is always the model's own default attention (captured before kernelize); a
spy counts kernel calls so a test cannot pass with the kernel silently not running. Padded batches are
compared on real (unpadded) positions only: what a padding row computes is not defined.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.errors import KernelHubError  # noqa: E402
from kernel_hub.layers import is_kernelized  # noqa: E402
from kernel_hub.layers.kinds.attention import call_plan as at_plan  # noqa: E402
from kernel_hub.layers.kinds.attention import config_switch as at_config  # noqa: E402
from kernel_hub.layers.kinds.attention import dispatch as at  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

# These tests pin the attention path's whole report: RMSNorm stays on its default (test_kernelize_rms_norm.py).
pytestmark = pytest.mark.usefixtures("no_rms_norm")

REPO = "kernel-hub/flash-attention-tpu"


@pytest.fixture(scope="module")
def fa():
    return kh.get_kernel(REPO, framework="torch", backend="cpu")


class Spy(types.SimpleNamespace):
    """Wraps the torch kernel module, counting flash_attention calls; keeps __kernel_hub__ for the report."""

    def __init__(self, kernel, fn=None):
        super().__init__(calls=0, __kernel_hub__=kernel.__kernel_hub__, describe=kernel.describe)
        self._fn = fn or kernel.flash_attention

    def flash_attention(self, *args, **kwargs):
        self.calls += 1
        return self._fn(*args, **kwargs)


llama = tiny.llama

# bf16 MoE models route every token to all experts: with top-2, a bf16 tie in the router flips an expert
# choice on a last-bit difference and moves logits by O(1) for either implementation.
MODELS = {
    "llama": lambda dt: llama(dt),
    "qwen3_moe": lambda dt: tiny.tiny_model("qwen3_moe", dtype=dt,
                                            **({"num_experts_per_tok": 8} if dt == torch.bfloat16 else {})),
    "gpt_oss": lambda dt: tiny.tiny_model("gpt_oss", dtype=dt, sliding_window=8,
                                          **({"num_experts_per_tok": 8} if dt == torch.bfloat16 else {})),
}
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def batch(seed=1, length=20):
    x = torch.randint(3, 120, (2, length), generator=torch.Generator().manual_seed(seed))
    left = torch.ones_like(x)
    left[1, :4] = 0
    right = torch.ones_like(x)
    right[0, -6:] = 0
    return x, left, right


def run(model, x, mask=None):
    with torch.no_grad():
        return model(x, attention_mask=mask).logits.float()


def rel(a, b, rows=None):
    if rows is not None:
        a, b = a[rows.bool()], b[rows.bool()]
    return ((a - b).abs().max() / b.abs().max()).item()


def attention_modules(model):
    return [n for n, m in model.named_modules() if type(m).__name__.endswith("Attention")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("family", list(MODELS))
def test_logits_padding_report_and_restore(family, dtype, fa):
    model = MODELS[family](dtype)
    x, left, right = batch()
    before = [run(model, x), run(model, x, left), run(model, x, right)]
    impl_before = model.config._attn_implementation
    spy = Spy(fa)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": spy}))

    layers = attention_modules(model)
    attn = [r for r in report.replaced if r.kind == "attention"]
    assert [r.layer for r in attn] == layers and len(layers) == 2
    assert not [k for k in report.kept if k.kind == "attention"]
    assert all(r.repo_id == REPO and r.variant == "torch-cpu" and r.max_error <= TOL[dtype] for r in attn)
    assert model.config._attn_implementation == at_config.IMPLEMENTATION_NAME

    calls = spy.calls
    after = [run(model, x), run(model, x, left), run(model, x, right)]
    assert spy.calls == calls + 3 * len(layers)  # every layer, every forward ran on the kernel
    hooks = [model.get_submodule(p).__dict__[at.HOOK_ATTR] for p in layers]
    assert all(h.fallbacks == 0 for h in hooks)
    assert rel(after[0], before[0]) <= TOL[dtype]
    assert rel(after[1], before[1], left) <= TOL[dtype]
    assert rel(after[2], before[2], right) <= TOL[dtype]

    assert kh.restore(model) is True
    assert model.config._attn_implementation == impl_before
    assert not any(at.HOOK_ATTR in m.__dict__ for m in model.modules())
    calls = spy.calls
    assert all(torch.equal(a, b) for a, b in zip([run(model, x), run(model, x, left), run(model, x, right)],
                                                  before, strict=True))
    assert spy.calls == calls


def test_gpt_oss_sinks_and_sliding_reach_the_kernel(fa):
    model = MODELS["gpt_oss"](torch.float32)
    seen = []

    def record(*args, **kwargs):
        seen.append((kwargs["sliding_window"], kwargs["sinks"] is not None))
        return fa.flash_attention(*args, **kwargs)

    kh.kernelize(model, mapping={"attention": Spy(fa, record), "moe_experts": None})
    seen.clear()
    run(model, batch()[0])
    assert seen == [(8, True), (None, True)]  # layer 0 sliding, layer 1 full; both with sinks


def test_generate_matches_with_cache(fa):
    model = MODELS["gpt_oss"](torch.float32)
    x, left, _ = batch(length=10)
    ref = model.generate(x, attention_mask=left, max_new_tokens=6, do_sample=False)
    spy = Spy(fa)
    kh.kernelize(model, mapping={"attention": spy})
    out = model.generate(x, attention_mask=left, max_new_tokens=6, do_sample=False)
    assert torch.equal(out, ref) and spy.calls > 0
    hooks = [m.__dict__[at.HOOK_ATTR] for m in model.modules() if at.HOOK_ATTR in m.__dict__]
    assert all(h.fallbacks == 0 for h in hooks)


def test_failing_validation_keeps_default_with_reason(fa):
    model = llama()
    x = batch()[0]
    before = run(model, x)
    report = kh.kernelize_report(
        kh.kernelize(model, mapping={"attention": Spy(fa, lambda *a, **k: fa.flash_attention(*a, **k) * 1.5)}))
    assert not report.replaced and len(report.kept) == 2
    assert all(k.reason.startswith("validation failed: max error") for k in report.kept)
    assert model.config._attn_implementation == "sdpa" and not is_kernelized(model)
    assert torch.equal(run(model, x), before)


def test_raising_kernel_is_kept_and_skip_and_unknown_kind(fa):
    def boom(*a, **k):
        raise RuntimeError("no luck")

    model = llama()
    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": Spy(fa, boom)}))
    assert all("kernel raised in validation: RuntimeError: no luck" in k.reason for k in report.kept)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": None}))
    assert not report.replaced and any("attention unchanged: no kernel mapped" in n for n in report.notes)
    with pytest.raises(KernelHubError, match="unknown layer kind 'attn'"):
        kh.kernelize(model, mapping={"attn": REPO})


def test_unexpressible_mask_falls_back_exactly(fa):
    model = llama()
    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": fa}))
    assert len(report.replaced) == 2
    x = batch()[0]
    holes = torch.ones_like(x)
    holes[0, 5] = 0  # a hole in the middle: not one contiguous run
    got = run(model, x, holes)
    kh.restore(model)
    assert torch.equal(got, run(model, x, holes))  # that call ran the previous implementation


def test_plan_call_decisions():
    causal = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    plan, why = at_plan.plan_call(causal[None, None], 4, 4, causal=True, window=None)
    assert plan is not None and plan.q_lengths is None and why == ""
    left = causal.clone()
    left[:, 0] = False
    plan, _ = at_plan.plan_call(left[None, None], 4, 4, causal=True, window=None)
    assert plan.q_shift.tolist() == [1] and plan.kv_lengths.tolist() == [3]
    assert at_plan.plan_call(causal[None, None], 4, 4, causal=True, window=2)[1].startswith("mask is not causal")
    assert at_plan.plan_call(None, 3, 5, causal=True, window=None)[0] is None
    assert at_plan.plan_call(torch.zeros(1, 2, 4, 4), 4, 4, causal=True, window=None)[1] == "per-head attention mask"


# --- the torch entry against the NumPy reference -------------------------------------------------

CASES = [
    dict(causal=True),
    dict(causal=True, sliding_window=5),
    dict(causal=True, logits_soft_cap=5.0, sinks=True),
    dict(causal=False, sinks=True, ragged=True),
    dict(causal=True, sliding_window=3, sinks=True, ragged=True),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_torch_entry_matches_reference(fa, case, dtype):
    from flash_attention_ref import reference_attention

    q, k, v, kw = _problem(CASES[case], getattr(torch, dtype))
    out = fa.flash_attention(q, k, v, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape
    ref = reference_attention(*(t.float().numpy() for t in (q, k, v)), **_numpy(kw))
    err = np.abs(out.float().numpy() - ref).max() / np.abs(ref).max()
    assert err <= (1e-5 if dtype == "float32" else 1e-2)


def _problem(case, dtype, b=3, hq=4, hkv=2, sq=9, skv=13, d=16):
    g = torch.Generator().manual_seed(7)
    mk = lambda *s: torch.randn(*s, generator=g).to(dtype)
    q, k, v = mk(b, hq, sq, d), mk(b, hkv, skv, d), mk(b, hkv, skv, d)
    kw = {key: val for key, val in case.items() if key not in ("sinks", "ragged")}
    if case.get("sinks"):
        kw["sinks"] = torch.randn(hq, generator=g)
    if case.get("ragged"):
        kw["q_lengths"] = torch.tensor([9, 4, 0], dtype=torch.int32)
        kw["kv_lengths"] = torch.tensor([13, 6, 3], dtype=torch.int32)
    return q, k, v, kw


def _numpy(kw):
    return {key: val.numpy() if isinstance(val, torch.Tensor) else val for key, val in kw.items()}


def test_torch_entry_gradients_match_float64(fa):
    """Autograd through the torch entry vs the same math in float64 (q, k, v and sinks)."""
    q, k, v, kw = _problem(CASES[4], torch.float32)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, kw["sinks"])]
    cot = torch.randn(q.shape, generator=torch.Generator().manual_seed(3))
    grads = []
    for dt in (torch.float32, torch.float64):
        xs = [t.detach().to(dt).requires_grad_(True) for t in leaves]
        out = fa.flash_attention(*xs[:3], **{**kw, "sinks": xs[3]})
        grads.append(torch.autograd.grad((out.double() * cot.double()).sum(), xs))
    for a, b in zip(*grads, strict=True):
        assert torch.isfinite(a).all()
        assert (a.double() - b).abs().max() / b.abs().max() <= 1e-5


def test_torch_entry_jax_bridge_matches_native(fa):
    """implementation="jax" runs the JAX package function via DLPack; forward and grads agree."""
    pytest.importorskip("jax")
    q, k, v, kw = _problem(CASES[4], torch.float32)
    xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ys = [t.clone().requires_grad_(True) for t in (q, k, v)]
    a = fa.flash_attention(*xs, **kw, implementation="torch")
    b = fa.flash_attention(*ys, **kw, implementation="jax")
    assert (a - b).abs().max() <= 1e-5
    ga = torch.autograd.grad(a.sum(), xs)
    gb = torch.autograd.grad(b.sum(), ys)
    assert all((x - y).abs().max() <= 1e-4 for x, y in zip(ga, gb, strict=True))


@pytest.fixture(scope="module", autouse=True)
def _reference_module(fa):
    """The package's NumPy reference (vendored shared code, plain NumPy), as the loaded torch build ships it."""
    import importlib

    sys.modules["flash_attention_ref"] = importlib.import_module(f"{fa.__name__}._vendor.attention_reference")
    yield
    sys.modules.pop("flash_attention_ref", None)
