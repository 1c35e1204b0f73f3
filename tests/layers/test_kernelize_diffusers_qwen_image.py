"""kernelize on Diffusers' Qwen-Image (QwenImageTransformer2DModel, diffusers 0.42): a tiny random-config model (two
double-stream blocks; nothing downloaded) gets its joint text+image attention on the flash-attention kernel through the
processor route and its RMSNorms (the text-input norm and each block's q/k and added q/k norms) on the RMSNorm kernel,
as Flux, SD3 and Wan do. With a text padding mask the kept keys are not a prefix ([text, text padding, image]): the
route moves them first, which is exact for this non-causal attention, so masked calls run on the kernel too. The
reference is the model's own forward captured before kernelize; spies count both kernels' calls; restore is exact."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.layers import diffusers as dl  # noqa: E402
from kernel_hub.layers import is_kernelized  # noqa: E402
from kernel_hub.layers.kinds.attention.diffusers_route import AttentionRoute  # noqa: E402
from kernel_hub.report import models  # noqa: E402

ATTENTION_REPO, NORM_REPO = "kernel-hub/flash-attention-tpu", "kernel-hub/rms-norm-tpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
ATTENTION = ["transformer_blocks.0.attn", "transformer_blocks.1.attn"]
NORMS = ["txt_norm"] + [f"transformer_blocks.{b}.attn.norm_{n}" for b in (0, 1)
                        for n in ("q", "k", "added_q", "added_k")]
TEXT = 7


def qwen_image(dtype):
    """Two double-stream blocks, 2 heads of 16, a 4x4 latent (16 image tokens after 2x2 packing) and 7 text tokens,
    batch 2; RMSNorm weights off 1.0 so a form that ignores them cannot pass."""
    from diffusers import QwenImageTransformer2DModel

    model = models._seeded(lambda: QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, axes_dims_rope=(4, 6, 6)))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for path in NORMS:
            weight = model.get_submodule(path).weight
            weight.copy_(torch.randn(weight.shape, generator=g) * 0.3 + 1.0)
    inputs = dict(hidden_states=torch.randn(2, 16, 16, generator=g), encoder_hidden_states=torch.randn(
        2, TEXT, 32, generator=g), timestep=torch.tensor([1.0, 0.5]), img_shapes=[[(1, 4, 4)]] * 2)
    model = model.to(dtype).eval()
    return model, {k: v.to(dtype) if isinstance(v, torch.Tensor) and k != "timestep" else v for k, v in inputs.items()}


def spy(kernel, name):
    """The torch kernel with a counting `name` function; keeps what the report reads."""
    ns = types.SimpleNamespace(calls=0, __kernel_hub__=kernel.__kernel_hub__, describe=kernel.describe)
    inner = getattr(kernel, name)

    def counted(*args, **kwargs):
        ns.calls += 1
        return inner(*args, **kwargs)

    setattr(ns, name, counted)
    return ns


def run(model, inputs, mask=None):
    with torch.no_grad():
        return model(**inputs, encoder_hidden_states_mask=mask, return_dict=False)[0].float()


def rel(a, b):
    assert torch.isfinite(a).all()
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_qwen_image_attention_and_rms_norms_kernelized_restore_exact(dtype):
    model, inputs = qwen_image(dtype)
    padded = torch.ones(2, TEXT, dtype=torch.bool)
    padded[1, 4:] = False  # the second prompt is 4 tokens: its 3 padding tokens sit before the image tokens
    before = {"none": run(model, inputs), "text padding": run(model, inputs, padded)}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    procs = {p: m.processor for p, m in model.named_modules() if hasattr(m, "set_processor")}
    assert list(procs) == ATTENTION
    fa = spy(kh.get_kernel(ATTENTION_REPO, framework="torch", backend="cpu"), "flash_attention")
    rn = spy(kh.get_kernel(NORM_REPO, framework="torch", backend="cpu"), "rms_norm")

    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": fa, "rms_norm": rn}))
    assert not report.kept, report
    assert [r.layer for r in report.replaced if r.kind == "attention"] == ATTENTION
    assert [r.layer for r in report.replaced if r.kind == "rms_norm"] == NORMS
    assert all(r.variant == "torch-cpu" and r.max_error <= TOL[dtype] for r in report.replaced)
    assert all(isinstance(model.get_submodule(p).processor, AttentionRoute) for p in ATTENTION)
    for case, mask in (("none", None), ("text padding", padded)):
        fa.calls = rn.calls = 0
        after = run(model, inputs, mask)
        assert fa.calls == len(ATTENTION) and rn.calls == len(NORMS), case  # both kernels served every call
        error = rel(after, before[case])
        print(f"qwen_image | {str(dtype).removeprefix('torch.')} | {case} | attention {len(ATTENTION)} + rms_norm "
              f"{len(NORMS)} replaced | max error {error:.2e}")
        assert error <= TOL[dtype], (case, error)
    assert all(fb[1] == 0 for fb in dl.fallbacks(model).values())  # no call fell back to torch's sdpa

    assert kh.restore(model) is True and not is_kernelized(model)
    assert all(model.get_submodule(p).processor is procs[p] for p in ATTENTION)
    assert all("forward" not in model.get_submodule(p).__dict__ for p in NORMS)
    assert all(torch.equal(v, state[n]) for n, v in model.state_dict().items())
    fa.calls = rn.calls = 0
    for case, mask in (("none", None), ("text padding", padded)):
        assert torch.equal(run(model, inputs, mask), before[case]), case  # bit-identical after restore
    assert fa.calls == rn.calls == 0
