"""Diffusers models through the layer kinds: kernelize finds their RMSNorms (torch.nn.RMSNorm in Flux, Diffusers' own
RMSNorm in SD3 with qk_norm="rms_norm") as on transformers models, next to the attention processors; outputs match the
unkernelized model, restore is exact, `mapping={"rms_norm": None}` skips the kind, and `trust_remote_code` reaches the
repos `mapping` names. The reference is the model's own forward, captured before kernelize; a spy counts the kernel's
calls so no test passes with the kernel silently not running."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.layers import is_kernelized  # noqa: E402
from kernel_hub.load.trust import TrustPolicy  # noqa: E402
from kernel_hub.report import models  # noqa: E402

NORM_REPO = "kernel-hub/rms-norm-tpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
FLUX_NORMS = [f"transformer_blocks.0.attn.norm_{n}" for n in ("q", "k", "added_q", "added_k")] + [
    f"single_transformer_blocks.0.attn.norm_{n}" for n in ("q", "k")]
FLUX_ATTENTION = ["transformer_blocks.0.attn", "single_transformer_blocks.0.attn"]


@pytest.fixture(scope="module")
def rn():
    return kh.get_kernel(NORM_REPO, framework="torch", backend="cpu")


def spy(kernel):
    """The torch RMSNorm kernel with a counting rms_norm; keeps what the report reads."""
    ns = types.SimpleNamespace(calls=0, __kernel_hub__=kernel.__kernel_hub__, describe=kernel.describe)

    def rms_norm(*args, **kwargs):
        ns.calls += 1
        return kernel.rms_norm(*args, **kwargs)

    ns.rms_norm = rms_norm
    return ns


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0].float()


def rel(a, b):
    assert torch.isfinite(a).all()
    return ((a - b).abs().max() / b.abs().max()).item()


def norms_of(model):
    return {p: m for p, m in model.named_modules() if "RMSNorm" in type(m).__name__}


def sd3_with_rms_norms(dtype=torch.float32):
    """The report's tiny SD3 with qk_norm="rms_norm": Diffusers' own RMSNorm on q/k (and the joint text q/k)."""
    from diffusers import SD3Transformer2DModel

    model = models._seeded(lambda: SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
        caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64, out_channels=4,
        dual_attention_layers=(0,), qk_norm="rms_norm")).to(dtype).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # weights off 1.0, so a form that ignores them cannot pass
        for m in norms_of(model).values():
            m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.3 + 1.0)
    inputs = dict(hidden_states=torch.randn(2, 4, 10, 10, generator=g), encoder_hidden_states=torch.randn(
        2, 7, 32, generator=g), pooled_projections=torch.randn(2, 64, generator=g), timestep=torch.tensor([1.0, 2.0]))
    return model, {k: v.to(dtype) if k != "timestep" else v for k, v in inputs.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_flux_rms_norms_and_attention_through_the_kinds(dtype, rn):
    model, inputs = models.diffusers_model("flux", dtype)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for m in norms_of(model).values():
            m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.3 + 1.0)
    before = run(model, inputs)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    k = spy(rn)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"rms_norm": k}))

    rows = {r.layer: r for r in report.replaced}
    assert [r.layer for r in report.replaced if r.kind == "rms_norm"] == FLUX_NORMS == list(norms_of(model))
    assert [r.layer for r in report.replaced if r.kind == "attention"] == FLUX_ATTENTION and not report.kept
    assert all(rows[p].repo_id == NORM_REPO and rows[p].variant == "torch-cpu" and rows[p].route == "forward"
               and rows[p].max_error <= TOL[dtype] for p in FLUX_NORMS)
    k.calls = 0
    after = run(model, inputs)
    assert k.calls == len(FLUX_NORMS)  # every RMSNorm of the forward ran on the kernel
    assert rel(after, before) <= TOL[dtype]

    assert kh.restore(model) is True and not is_kernelized(model)
    assert all("forward" not in m.__dict__ for m in norms_of(model).values())
    assert all(torch.equal(v, state[n]) for n, v in model.state_dict().items())
    k.calls = 0
    assert torch.equal(run(model, inputs), before) and k.calls == 0  # bit-identical, kernel no longer called


def test_diffusers_rms_norm_replaced_a_biased_one_kept_and_mapping_none_skips(rn):
    model, inputs = sd3_with_rms_norms()
    norms = list(norms_of(model))
    assert norms and all(type(m).__module__.startswith("diffusers.") for m in norms_of(model).values())
    biased = norms[0]
    with torch.no_grad():  # Diffusers' RMSNorm(bias=True): the kernel adds no bias, so this one must be kept
        model.get_submodule(biased).bias = torch.nn.Parameter(torch.full((8,), 0.5))
    before = run(model, inputs)
    k = spy(rn)
    report = kh.kernelize_report(kh.kernelize(model, mapping={"rms_norm": k}))
    assert [r.layer for r in report.replaced if r.kind == "rms_norm"] == norms[1:]
    assert [(r.layer, r.kind) for r in report.kept] == [(biased, "rms_norm")]
    assert "adds a bias" in report.kept[0].reason
    assert any(r.kind == "attention" for r in report.replaced)
    k.calls = 0
    assert rel(run(model, inputs), before) <= 1e-4 and k.calls == len(norms) - 1
    kh.restore(model)
    assert torch.equal(run(model, inputs), before)

    report = kh.kernelize_report(kh.kernelize(model, mapping={"rms_norm": None}))
    assert not [r for r in report.replaced + report.kept if r.kind == "rms_norm"]
    assert any(n.startswith("rms_norm unchanged: no kernel mapped") for n in report.notes)
    assert any(r.kind == "attention" for r in report.replaced)  # the other kinds still run
    assert all("forward" not in m.__dict__ for m in norms_of(model).values())
    kh.restore(model)
    assert torch.equal(run(model, inputs), before)


def test_trust_remote_code_reaches_the_repos_mapping_names_for_diffusers(rn, monkeypatch):
    import kernel_hub.layers.load as layer_load

    asked = []

    def get_kernel(repo_id, **kw):  # the loader kernelize calls: record what it was asked, serve the local build
        asked.append((repo_id, kw.get("trust_remote_code")))
        return rn

    monkeypatch.setattr(layer_load, "get_kernel", get_kernel)
    model, inputs = models.diffusers_model("flux")
    before = run(model, inputs)
    report = kh.kernelize_report(
        kh.kernelize(model, mapping={"rms_norm": {"repo_id": "acme/rms-norm", "version": 1}, "attention": None},
                          trust_remote_code=["acme"]))
    assert asked == [("acme/rms-norm", TrustPolicy(named=("acme",)))]  # read once by kernelize, handed down
    assert [r.layer for r in report.replaced] == FLUX_NORMS and all(r.repo_id == "acme/rms-norm"
                                                                    for r in report.replaced)
    assert rel(run(model, inputs), before) <= 1e-4
    kh.restore(model)
    assert torch.equal(run(model, inputs), before)


def test_pipeline_rows_carry_the_component_and_restore_reaches_it(rn):
    """A FluxPipeline (tiny transformer and VAE, no text encoders): the kinds run on the denoiser, rows are named
    `transformer.<path>`, and restore(pipe) puts back every norm's forward and processor."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline

    transformer, inputs = models.diffusers_model("flux")
    vae = models._seeded(lambda: AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
        block_out_channels=(8,), layers_per_block=1, latent_channels=4, norm_num_groups=4)).eval()
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None, tokenizer=None,
                        text_encoder_2=None, tokenizer_2=None, transformer=transformer)
    before = run(transformer, inputs)
    k = spy(rn)
    report = kh.kernelize_report(kh.kernelize(pipe, mapping={"rms_norm": k}))
    assert [r.layer for r in report.replaced if r.kind == "rms_norm"] == [f"transformer.{p}" for p in FLUX_NORMS]
    assert [r.layer for r in report.replaced if r.kind == "attention"] == [f"transformer.{p}" for p in FLUX_ATTENTION]
    k.calls = 0
    assert rel(run(transformer, inputs), before) <= 1e-4 and k.calls == len(FLUX_NORMS)
    assert kh.restore(pipe) is True and not is_kernelized(transformer)
    assert all("forward" not in m.__dict__ for m in norms_of(transformer).values())
    assert torch.equal(run(transformer, inputs), before)
