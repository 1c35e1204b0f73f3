"""kernelize on Diffusers: tiny Flux, SD3 and Wan transformers (random weights, built from configs, nothing
downloaded) and a FluxPipeline assembled from tiny components.

The reference is always the model's own default attention (torch sdpa through Diffusers' processors),
captured before kernelize; a spy counts the kernel's calls so no test passes with the kernel silently
not running. Restore is checked with torch.equal and object identity of every processor.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.errors import KernelHubError  # noqa: E402
from kernel_hub.layers import diffusers as dl  # noqa: E402
from kernel_hub.layers import is_kernelized  # noqa: E402
from kernel_hub.layers.kinds.attention.diffusers_route import AttentionRoute, plan_sdpa, run_plan  # noqa: E402
from kernel_hub.report import models  # noqa: E402

#: These tests pin the attention path's whole report; RMSNorm on Diffusers:
#: tests/layers/test_kernelize_diffusers_kinds.py.
pytestmark = pytest.mark.usefixtures("no_rms_norm")

REPO = "kernel-hub/flash-attention-tpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module")
def fa():
    return kh.get_kernel(REPO, framework="torch", backend="cpu")


def spy(kernel, fn=None):
    """The torch kernel module with a counting (or replaced) flash_attention; keeps what the report reads."""
    ns = types.SimpleNamespace(calls=0, __kernel_hub__=kernel.__kernel_hub__, describe=kernel.describe)
    inner = fn or kernel.flash_attention

    def flash_attention(*args, **kwargs):
        ns.calls += 1
        return inner(*args, **kwargs)

    ns.flash_attention = flash_attention
    return ns


FAMILIES = list(models.DIFFUSERS_FAMILIES)
flux, _seeded = models.flux, models._seeded
#: attention modules per family (a self/joint/cross mix), the paths kernelize must report.
LAYERS = {
    "flux": ["transformer_blocks.0.attn", "single_transformer_blocks.0.attn"],
    "sd3": ["transformer_blocks.0.attn", "transformer_blocks.0.attn2", "transformer_blocks.1.attn"],
    "wan": ["blocks.0.attn1", "blocks.0.attn2", "blocks.1.attn1", "blocks.1.attn2"],
}


def build(family, dtype=torch.float32):
    return models.diffusers_model(family, dtype)


def run(model, inputs, **extra):
    with torch.no_grad():
        return model(**inputs, **extra, return_dict=False)[0].float()


def rel(a, b):
    assert torch.isfinite(a).all()
    return ((a - b).abs().max() / b.abs().max()).item()


def processors(model):
    return {p: m.processor for p, m in model.named_modules() if hasattr(m, "set_processor")}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_matches_default_report_and_restore(family, dtype, fa):
    model, inputs = build(family, dtype)
    before, procs = run(model, inputs), processors(model)
    k = spy(fa)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": k}))

    assert [r.layer for r in report.replaced] == LAYERS[family] == list(procs) and not report.kept
    assert all(r.repo_id == REPO and r.variant == "torch-cpu" and r.route == "processor"
               and r.max_error <= TOL[dtype] for r in report.replaced)
    data = json.loads(report.to_json())
    assert [r["layer"] for r in data["replaced"]] == LAYERS[family]
    assert all(isinstance(m.processor, AttentionRoute) for m in map(model.get_submodule, LAYERS[family]))

    k.calls = 0
    after = run(model, inputs)
    assert k.calls == len(LAYERS[family])  # every attention call of the forward ran on the kernel
    assert all(fb == (1, 0, "") for fb in dl.fallbacks(model).values())
    assert rel(after, before) <= TOL[dtype]

    assert kh.restore(model) is True and not is_kernelized(model)
    assert all(processors(model)[p] is procs[p] for p in procs)  # the very same processor objects
    k.calls = 0
    assert torch.equal(run(model, inputs), before) and k.calls == 0
    assert kh.restore(model) is False


def test_key_padding_mask_runs_on_kernel_other_masks_fall_back_exactly(fa):
    model, inputs = build("flux")
    seq = 8 + 16  # Flux attends over [text, image] tokens
    tail = torch.ones(2, seq, dtype=torch.bool)
    tail[1, 19:] = False  # key padding at the end of sequence 1: the kernel's kv_lengths
    holes = torch.ones(2, seq, dtype=torch.bool)
    holes[0, 5:8] = False  # padded text tokens before the image tokens: kept keys moved first, then kv_lengths
    per_head = torch.ones(2, 2, seq, seq, dtype=torch.bool)
    per_head[0, 1, :, 3] = False  # differs across heads: not a key-padding mask
    masks = (tail, holes, per_head)
    refs = [run(model, inputs, joint_attention_kwargs={"attention_mask": m}) for m in masks]
    k = spy(fa)
    kh.kernelize(model, mapping={"attention": k})

    got = run(model, inputs, joint_attention_kwargs={"attention_mask": tail})
    assert k.calls == 2 + 2 and rel(got, refs[0]) <= 1e-4  # 2 validation calls + 2 layers
    got = run(model, inputs, joint_attention_kwargs={"attention_mask": holes})
    assert k.calls == 2 + 4 and rel(got, refs[1]) <= 1e-4
    got = run(model, inputs, joint_attention_kwargs={"attention_mask": per_head})
    assert torch.equal(got, refs[2]) and k.calls == 6  # both layers ran torch's sdpa with the same arguments
    assert all(fb == (2, 1, "mask differs across heads or query rows (not a key-padding mask)")
               for fb in dl.fallbacks(model).values())


def test_training_mode_gradients_match_default(fa):
    model, inputs = build("flux")
    model.train()

    def grads():
        model.zero_grad()
        model(**inputs, return_dict=False)[0].square().mean().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    ref = grads()
    k = spy(fa)
    report = kh.kernelize_report(kh.kernelize(model, mode="training", mapping={"attention": k}))
    assert len(report.replaced) == 2 and any("backward is the kernel's autograd" in n for n in report.notes)
    k.calls = 0
    assert rel(grads(), ref) <= 1e-4 and k.calls == 2
    kh.restore(model)
    assert torch.equal(grads(), ref)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_layer_on_another_backend_is_kept_with_reason(fa):
    model, inputs = build("flux")
    model.transformer_blocks[0].attn.set_attention_backend("flex")  # a backend that never calls sdpa
    before = run(model, inputs)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": fa}))
    assert [r.layer for r in report.replaced] == ["single_transformer_blocks.0.attn"]
    assert [(k.layer, k.reason) for k in report.kept] == [(
        "transformer_blocks.0.attn",
        "FluxAttnProcessor did not call torch scaled_dot_product_attention (attention backend: flex)")]
    assert not isinstance(model.transformer_blocks[0].attn.processor, AttentionRoute)
    assert rel(run(model, inputs), before) <= 1e-4
    kh.restore(model)
    assert model.transformer_blocks[0].attn.processor._attention_backend.value == "flex"
    assert torch.equal(run(model, inputs), before)


def test_failing_or_raising_kernel_keeps_every_layer_untouched(fa):
    model, inputs = build("wan")
    before, procs = run(model, inputs), processors(model)
    report = kh.kernelize_report(
        kh.kernelize(model, mapping={"attention": spy(fa, lambda *a, **kw: fa.flash_attention(*a, **kw) * 1.5)}))
    assert not report.replaced and [k.layer for k in report.kept] == LAYERS["wan"]
    assert all(k.reason.startswith("validation failed: max error") for k in report.kept)

    def boom(*a, **kw):
        raise RuntimeError("no luck")

    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": spy(fa, boom)}))
    assert all(k.reason == "kernel raised in validation: RuntimeError: no luck" for k in report.kept)
    assert not is_kernelized(model) and all(processors(model)[p] is procs[p] for p in procs)
    assert torch.equal(run(model, inputs), before)

    report = kh.kernelize_report(kh.kernelize(model, mapping={"attention": None}))
    assert not report.replaced and any("attention unchanged: no kernel mapped" in n for n in report.notes)
    with pytest.raises(KernelHubError, match="unknown layer kind 'attn'"):
        kh.kernelize(model, mapping={"attn": REPO})


def test_interrupt_midway_restores_before_propagating(fa):
    model, inputs = build("sd3")
    before, procs = run(model, inputs), processors(model)
    seen = []

    def interrupt(*a, **kw):
        seen.append(1)
        if len(seen) == 2:  # the second layer's validation: the first is already routed
            raise KeyboardInterrupt
        return fa.flash_attention(*a, **kw)

    with pytest.raises(KeyboardInterrupt):
        kh.kernelize(model, mapping={"attention": spy(fa, interrupt)})
    assert not is_kernelized(model) and all(processors(model)[p] is procs[p] for p in procs)
    assert torch.equal(run(model, inputs), before)


def test_flux_pipeline_denoising_matches_default(fa):
    """FluxPipeline from tiny components: transformer + FlowMatch Euler scheduler + AutoencoderKL; the text
    encoders and tokenizers are left out (None) and the prompt embeddings passed in, so nothing is downloaded."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline

    transformer = flux(torch.float32, in_channels=16)[0].eval()
    vae = _seeded(lambda: AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1, latent_channels=4,
        norm_num_groups=4, shift_factor=0.06, scaling_factor=0.36)).eval()
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(3)
    embeds = dict(prompt_embeds=torch.randn(1, 8, 32, generator=g),
                  pooled_prompt_embeds=torch.randn(1, 32, generator=g))

    def denoise():
        return pipe(**embeds, height=16, width=16, num_inference_steps=2, guidance_scale=3.5, output_type="pt",
                    generator=torch.Generator().manual_seed(0)).images

    before = denoise()
    k = spy(fa)
    report = kh.kernelize_report(kh.kernelize(pipe, mapping={"attention": k}))
    assert [r.layer for r in report.replaced] == [f"transformer.{p}" for p in LAYERS["flux"]]
    assert any(n.startswith("untouched components") and "vae (AutoencoderKL)" in n for n in report.notes)
    k.calls = 0
    after = denoise()
    assert k.calls == 2 * 2  # two steps x two attention layers
    assert after.shape == before.shape == (1, 3, 16, 16) and rel(after, before) <= 1e-4
    assert kh.restore(pipe) is True and not is_kernelized(pipe.transformer)
    assert torch.equal(denoise(), before)


def test_plan_sdpa_decisions_and_kernel_against_sdpa(fa):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 8, generator=g) for _ in range(3))
    keys = torch.arange(9) < torch.tensor([[9], [5]])  # [2, 9] key padding, sequence 1 keeps 5 keys
    cases = {
        "plain": dict(),
        "bool key padding": dict(attn_mask=keys[:, None, None, :]),
        "additive key padding": dict(attn_mask=torch.zeros(2, 1, 9, 9).masked_fill(~keys[:, None, None], -torch.inf)),
        "causal": dict(is_causal=True),
        "scale": dict(scale=0.3),
    }
    for name, kw in cases.items():
        plan, why = plan_sdpa(q, k, v, **kw)
        assert plan is not None and why == "", name
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
        assert rel(run_plan(fa.flash_attention, plan, q, k, v), ref) <= 1e-5, name
    assert plan_sdpa(q, k, v, attn_mask=keys[:, None, None, :])[0].kv_lengths.tolist() == [9, 5]
    holes = keys.clone()
    holes[0, 2:4] = False  # keys 2, 3 dropped in the middle; sequence 1 keeps its 5 first
    plan, _ = plan_sdpa(q, k, v, attn_mask=holes[:, None, None, :])
    assert plan.kv_lengths.tolist() == [7, 5] and plan.key_order[0, :7].tolist() == [0, 1, 4, 5, 6, 7, 8]
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=holes[:, None, None, :])
    assert rel(run_plan(fa.flash_attention, plan, q, k, v), ref) <= 1e-5
    kv2 = k[:, :2]
    plan, _ = plan_sdpa(q, kv2, kv2, enable_gqa=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, kv2, kv2, enable_gqa=True)
    assert rel(run_plan(fa.flash_attention, plan, q, kv2, kv2), ref) <= 1e-5
    plan, _ = plan_sdpa(q[0], k[0], v[0])  # 3-D [N, S, D]
    assert rel(run_plan(fa.flash_attention, plan, q[0], k[0], v[0]),
               torch.nn.functional.scaled_dot_product_attention(q[0], k[0], v[0])) <= 1e-5

    refused = {
        "attention dropout": dict(dropout_p=0.1),
        "additive mask with bias values": dict(attn_mask=torch.randn(2, 1, 9, 9)),
        "mask differs across heads or query rows (not a key-padding mask)": dict(
            attn_mask=torch.tril(torch.ones(9, 9, dtype=torch.bool))),
        "a sequence with no key to attend (sdpa gives NaN there)": dict(attn_mask=torch.zeros(9, dtype=torch.bool)),
    }
    for why, kw in refused.items():
        assert plan_sdpa(q, k, v, **kw) == (None, why)
    assert plan_sdpa(q, kv2, kv2)[1] == "4 query heads over 2 key heads without enable_gqa"
    assert plan_sdpa(q, k[:, :, :5], v[:, :, :5], is_causal=True)[1].startswith("causal with a mask or fewer")
    assert plan_sdpa(q, k, v[..., :4])[1] == "value head size differs from the query/key head size"


def test_detection_imports_nothing_and_kernel_hub_stays_light():
    code = ("import sys, kernel_hub; assert 'torch' not in sys.modules and 'diffusers' not in sys.modules;"
            "import torch; from kernel_hub.layers.diffusers import is_diffusers_object as d;"
            "assert not d(torch.nn.Linear(2, 2)) and 'diffusers' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    model, _ = build("flux")
    assert dl.is_diffusers_object(model) and dl.is_denoiser(model) and not dl.is_pipeline(model)
