"""transformers 5.25's own kernel entry points on our repos, as far as transformers allows on CPU, through
`kernel-hub serve` (loopback) with PyPI kernels 0.19.1.

- `use_kernels=True` + `KernelConfig({"<Family>Experts": "kernel-hub/ragged-dot-tpu:MoEExperts"})`: transformers
  loads our `layers.MoEExperts`, finds its companion `MoEExpertsLayout` and registers it in place of the model's
  experts class; the model is then built with it and the checkpoint loads into it. On CPU the same call then stops
  at transformers' device check ("Only devices in [...] supported, got: cpu"): that error is asserted, then that a
  plain load in the same process builds the model's own experts class (the Layout left transformers' process-wide
  mapping when that build made it), and the rest of what the call would do (HF kernels' `kernelize` swapping the
  Layout's forward for MoEExperts') is run here by hand with `device="cpu"`. Logits against the unpatched model
  with the same weights, Qwen3-MoE and GPT-OSS.
- The RMSNorm names transformers 5.25 still marks: "RMSNormZeroCentered" (Qwen3.5) onto our layer of that name.
"""

from __future__ import annotations

import pytest

from tests.hub_interop import KERNELS

MOE_REPO = "kernel-hub/ragged-dot-tpu"
NORM_REPO = "kernel-hub/rms-norm-tpu"
#: published by the interop_hub fixture (tests/conftest.py)
INTEROP_KERNELS = {MOE_REPO: KERNELS / "ragged_dot", NORM_REPO: KERNELS / "rms_norm"}

KERNEL_CONFIG_SCRIPT = """
import json, sys, tempfile, torch
from transformers import AutoModelForCausalLM, GptOssConfig, KernelConfig, Qwen3MoeConfig
from transformers.monkey_patching import apply_patches, get_patch_mapping
from kernels import LayerRepository, Mode, kernelize, use_kernel_mapping

COMMON = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, num_experts_per_tok=2, max_position_embeddings=64)
FAMILIES = {
    "qwen3_moe": (Qwen3MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=24, num_experts=8),
                  "Qwen3MoeExperts"),
    "gpt_oss": (GptOssConfig(**COMMON, intermediate_size=24, num_local_experts=8,
                             layer_types=["full_attention"] * 2), "GptOssExperts"),
}
out = {}
for family, (cfg, experts_class) in FAMILIES.items():
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.2)
    path = tempfile.mkdtemp()
    ref.save_pretrained(path)
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
    kc = KernelConfig({experts_class: (f"{REPO}:MoEExperts", {"version": 1, "trust_remote_code": True})})
    row = {}
    try:
        AutoModelForCausalLM.from_pretrained(path, use_kernels=True, kernel_config=kc)
        row["use_kernels"] = "loaded"
    except ValueError as e:
        row["use_kernels"] = str(e)
    # transformers registered the Layout process-wide before it refused the device; the Layout left that mapping
    # when the refused call built it, so a plain load in this process builds the model's own experts class
    plain = AutoModelForCausalLM.from_pretrained(path).eval()
    row["plain_experts"] = sorted({type(m).__name__ for m in plain.modules() if type(m).__name__.endswith("Experts")
                                   or type(m).__name__.endswith("Layout")})
    row["left_registered"] = sorted(k for k, v in get_patch_mapping().items() if v.__name__ == "MoEExpertsLayout")
    # what the call would do past the device check, by hand: the model built with the Layout in the experts' place
    kernel_cls = LayerRepository(repo_id=REPO, layer_name="MoEExperts", version=1, trust_remote_code=True).load()
    layout_cls = getattr(sys.modules[kernel_cls.__module__], "MoEExpertsLayout")
    with apply_patches({experts_class: layout_cls}):
        model = AutoModelForCausalLM.from_pretrained(path).eval()
    layouts = [m for m in model.modules() if type(m).__name__ == "MoEExpertsLayout"]
    row["layouts"] = len(layouts)
    row["layout_module"] = type(layouts[0]).__module__ if layouts else None
    row["layout_file"] = sys.modules[type(layouts[0]).__module__].__file__ if layouts else None
    row["kernel_layer_name"] = getattr(type(layouts[0]), "kernel_layer_name", None) if layouts else None
    row["weights_equal"] = all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(),
                                                                  model.state_dict().values()))
    with torch.no_grad():
        row["layout_err"] = (model(ids).logits - want).abs().max().item()
    mapping = {"MoEExperts": {"cpu": LayerRepository(repo_id=REPO, layer_name="MoEExperts", version=1,
                                                      trust_remote_code=True)}}
    with use_kernel_mapping(mapping):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    row["swapped"] = [m.forward.__func__.__qualname__ if "forward" in m.__dict__ else None for m in layouts]
    with torch.no_grad():
        got = model(ids).logits
    row["kernelized_err"] = (got - want).abs().max().item()
    row["finite"] = bool(torch.isfinite(got).all())
    row["scale"] = want.abs().max().item()
    out[family] = row
print(json.dumps(out))
"""


def test_kernel_config_builds_the_layout_and_kernelize_swaps_in_moe_experts(interop_hub) -> None:
    rows = interop_hub.run(KERNEL_CONFIG_SCRIPT, REPO=MOE_REPO)
    experts_of = {"qwen3_moe": "Qwen3MoeExperts", "gpt_oss": "GptOssExperts"}
    assert set(rows) == set(experts_of)
    for family, row in rows.items():
        # the device restriction, verbatim from transformers 5.25 (KernelConfig's supported device types)
        assert row["use_kernels"].startswith("Only devices in [") and row["use_kernels"].endswith("got: cpu"), row
        assert "'tpu'" in row["use_kernels"] and "'cpu'" not in row["use_kernels"].split("got:")[0]
        # the failed call leaves no registration: a later plain load in the same process builds the model's class
        assert row["plain_experts"] == [experts_of[family]] and row["left_registered"] == [], (family, row)
        assert row["layouts"] == 2, (family, row)  # one per decoder layer, in place of the experts class
        assert row["layout_module"].endswith(".layers") and "/build/torch-cpu/" in row["layout_file"], row
        assert row["kernel_layer_name"] == "MoEExperts", row
        assert row["weights_equal"], (family, "the checkpoint did not load into the Layout's parameters")
        assert row["swapped"] == ["MoEExperts.forward"] * 2, row
        assert row["finite"] and row["scale"] > 0.1, row
        # f32 logits of a 2-layer model vs the unpatched model (transformers' own experts): float32 rounding only
        assert row["layout_err"] < 2e-5 * row["scale"] and row["kernelized_err"] < 2e-5 * row["scale"], (family, row)


ZERO_CENTERED_SCRIPT = """
import json, torch
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm
from kernels import LayerRepository, Mode, kernelize, use_kernel_mapping

out = {}
for dtype in ("float32", "bfloat16"):
    norm = Qwen3_5RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=torch.Generator().manual_seed(2)) * 0.5)
    x = (torch.randn(5, 64, generator=torch.Generator().manual_seed(3)) * 3).to(getattr(torch, dtype))
    ref = norm(x)
    mapping = {"RMSNormZeroCentered": {"cpu": LayerRepository(repo_id=REPO, layer_name="RMSNormZeroCentered",
                                                               version=1)}}
    with use_kernel_mapping(mapping):
        kernelize(norm, mode=Mode.INFERENCE, device="cpu")
    got = norm(x)
    out[dtype] = {"module": norm.forward.__func__.__module__, "qualname": norm.forward.__func__.__qualname__,
                  "err": (got.float() - ref.float()).abs().max().item(), "scale": ref.float().abs().max().item(),
                  "dtype": str(got.dtype)}
print(json.dumps(out))
"""


def test_rms_norm_zero_centered_reaches_our_layer(interop_hub) -> None:
    rows = interop_hub.run(ZERO_CENTERED_SCRIPT, REPO=NORM_REPO)
    for dtype, row in rows.items():
        assert row["module"].endswith(".layers") and row["qualname"] == "RMSNormZeroCentered.forward", row
        assert row["dtype"] == f"torch.{dtype}"
        # the same float32 arithmetic and one final cast: f32 to rounding, bf16 within one bf16 step of the output
        bound = 1e-6 if dtype == "float32" else 2 ** -7
        assert row["err"] <= bound * row["scale"], (dtype, row)


def test_the_layout_refuses_a_config_it_cannot_read() -> None:
    """A config without the sizes or with an activation the kernel does not compute: one UnsupportedLayout naming
    what is missing, at build time (never a model with uninitialised or wrong experts)."""
    from types import SimpleNamespace

    import kernel_hub as kh

    layers = kh.get_local_kernel(KERNELS / "ragged_dot", framework="torch").layers
    good = dict(num_experts=4, hidden_size=8, moe_intermediate_size=6, hidden_act="silu")
    layout = layers.MoEExpertsLayout(SimpleNamespace(**good))
    assert tuple(layout.gate_up_proj.shape) == (4, 12, 8) and tuple(layout.down_proj.shape) == (4, 8, 6)
    with pytest.raises(layers.UnsupportedLayout, match=r"none of \['num_local_experts', 'num_experts'"):
        layers.MoEExpertsLayout(SimpleNamespace(**{**good, "num_experts": None}))
    with pytest.raises(layers.UnsupportedLayout, match="activation 'quick_gelu'"):
        layers.MoEExpertsLayout(SimpleNamespace(**{**good, "hidden_act": "quick_gelu"}))
    gpt = layers.MoEExpertsLayout(SimpleNamespace(num_local_experts=4, hidden_size=8, intermediate_size=6,
                                                  swiglu_alpha=1.702, swiglu_limit=7.0))
    assert tuple(gpt.gate_up_proj.shape) == (4, 8, 12) and tuple(gpt.down_proj_bias.shape) == (4, 8)
    assert (gpt.is_transposed, gpt.is_concatenated, gpt.has_bias) == (True, False, True)


def test_the_layout_serves_one_build_then_leaves_the_patch_mapping() -> None:
    """transformers' process-wide registration (what KernelConfig does) serves the build in progress, every layer of
    it, and is gone after it; a config the Layout refuses leaves nothing registered either."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, Qwen3MoeConfig
    from transformers.monkey_patching import get_patch_mapping, register_patch_mapping, unregister_patch_mapping

    import kernel_hub as kh

    layers = kh.get_local_kernel(KERNELS / "ragged_dot", framework="torch").layers
    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=24, moe_intermediate_size=8,
                         num_experts=4, num_experts_per_tok=2)

    def experts_classes(model) -> list[str]:
        return [type(m).__name__ for n, m in model.named_modules() if n.endswith("mlp.experts")]

    try:
        register_patch_mapping({"Qwen3MoeExperts": layers.MoEExpertsLayout}, overwrite=True)
        assert experts_classes(AutoModelForCausalLM.from_config(cfg)) == ["MoEExpertsLayout"] * 3
        assert "Qwen3MoeExperts" not in get_patch_mapping()
        assert experts_classes(AutoModelForCausalLM.from_config(cfg)) == ["Qwen3MoeExperts"] * 3
        register_patch_mapping({"Qwen3MoeExperts": layers.MoEExpertsLayout}, overwrite=True)
        with pytest.raises(layers.UnsupportedLayout):
            layers.MoEExpertsLayout(SimpleNamespace(num_experts=4, hidden_size=8, moe_intermediate_size=6,
                                                    hidden_act="quick_gelu"))
        assert "Qwen3MoeExperts" not in get_patch_mapping()
    finally:
        if "Qwen3MoeExperts" in get_patch_mapping():
            unregister_patch_mapping(["Qwen3MoeExperts"])
