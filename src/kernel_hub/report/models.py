"""Tiny models built from configs with random weights: the families kernelize is tested on and the report's
family matrix runs (transformers MoE and attention models, Diffusers transformers).

No downloads: each family is its config class with small sizes. Shapes stay distinct (hidden 64,
expert width 32, 8 experts) so a transposed or interleaved layout cannot pass by accident. Imports torch,
transformers and diffusers only when a model is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

#: A Diffusers family's tiny transformer and the keyword inputs of one forward.
ModelInputs: TypeAlias = "tuple[torch.nn.Module, dict[str, torch.Tensor]]"

_COMMON: dict[str, Any] = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
    eos_token_id=2,
)

#: family -> (modeling module, causal-LM class, config class, config overrides)
FAMILIES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
                  dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
                       mlp_only_layers=[], norm_topk_prob=True)),
    "mixtral": ("mixtral", "MixtralForCausalLM", "MixtralConfig",
                dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32)),
    "gpt_oss": ("gpt_oss", "GptOssForCausalLM", "GptOssConfig",
                dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, sliding_window=16,
                     layer_types=["sliding_attention", "full_attention"])),
    "olmoe": ("olmoe", "OlmoeForCausalLM", "OlmoeConfig",
              dict(num_experts=8, num_experts_per_tok=2, intermediate_size=32)),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3ForCausalLM", "DeepseekV3Config",
                    dict(moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
                         topk_group=1, n_shared_experts=1, first_k_dense_replace=1, num_hidden_layers=3,
                         kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8,
                         v_head_dim=16, head_dim=8, num_key_value_heads=4)),  # MLA: one KV head per head
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig",
                  dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                       shared_expert_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[])),
    "gemma4": ("gemma4", "Gemma4ForCausalLM", "Gemma4TextConfig",
               dict(enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32,
                    hidden_size_per_layer_input=0, vocab_size_per_layer_input=128, sliding_window=16,
                    layer_types=["sliding_attention", "full_attention"], global_head_dim=16,
                    head_dim=16)),
}


def family_names() -> list[str]:
    return list(FAMILIES)


def tiny_config(family: str, **overrides: object) -> PretrainedConfig:
    module, _, config_name, extra = FAMILIES[family]
    cfg_mod = importlib.import_module(f"transformers.models.{module}.configuration_{module}")
    cfg_cls = getattr(cfg_mod, config_name)
    kwargs = {**_COMMON, **extra, **overrides}
    return cfg_cls(**kwargs)


def tiny_model(family: str, *, dtype: torch.dtype | None = None, seed: int = 0, **overrides: object) -> torch.nn.Module:
    """A random-weight causal LM of `family`, in eval mode, on CPU (float32 unless `dtype`)."""
    import torch

    module, cls_name, _, _ = FAMILIES[family]
    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    config = tiny_config(family, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(mod, cls_name)(config)
        _randomize_experts(model, seed)
    return model.to(dtype or torch.float32).eval()


def _randomize_experts(model: torch.nn.Module, seed: int) -> None:
    """Some families initialise expert weights (and biases) to zero or constants; give every 3-D
    expert weight and bias real random values so a wrong layout cannot hide."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("gate_up_proj", "down_proj", "up_proj") and p.dim() == 3:
                p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-2:]) ** 0.5)
            elif leaf.endswith("_bias") and ("experts" in name):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


#: Small sizes for any MoE config class (only the names a config has are passed).
GENERIC_SHRINK: dict[str, Any] = dict(
    vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_local_experts=4,
    n_routed_experts=4, num_experts_per_tok=2, top_k_experts=2, moe_topk=2, n_group=1, topk_group=1,
    max_position_embeddings=64, first_k_dense_replace=0, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=16,
    qk_nope_head_dim=16, v_head_dim=16, n_shared_experts=1, num_shared_experts=1, decoder_sparse_step=1,
    mlp_only_layers=[], shared_expert_intermediate_size=32, moe_layer_freq=1, pad_token_id=0, bos_token_id=1,
    eos_token_id=2,
    # the hybrids' state-space and linear-attention mixers (mamba heads x head dim = expand x hidden)
    shared_intermediate_size=32, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=16,
    linear_num_heads=4, linear_head_dim=16,
)


def generic_tiny_model(family: str, *, dtype: torch.dtype | None = None, seed: int = 0) -> torch.nn.Module:
    """Any transformers MoE family shrunk by GENERIC_SHRINK (its first *ForCausalLM class)."""
    import torch

    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    names = sorted(n for n in dir(mod) if n.endswith("ForCausalLM"))
    if not names:
        raise LookupError(f"{family} has no *ForCausalLM class")
    cls = getattr(mod, names[0])
    base = cls.config_class()
    config = cls.config_class(**{k: v for k, v in GENERIC_SHRINK.items() if hasattr(base, k)})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
        _randomize_experts(model, seed)
    return model.to(dtype or torch.float32).eval()


_MLA: dict[str, Any] = dict(  # multi-head latent attention: one KV head per query head, split q/k dims
    num_key_value_heads=4, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8,
)

#: Families the generic shrink cannot build or run: family -> (modeling module, model class, config
#: class, overrides on top of GENERIC_SHRINK). Vision/omni models use their text model (and text config).
HAND_FAMILIES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "deepseek_v2": ("deepseek_v2", "DeepseekV2ForCausalLM", "DeepseekV2Config", dict(_MLA)),
    "deepseek_v32": ("deepseek_v32", "DeepseekV32ForCausalLM", "DeepseekV32Config", dict(_MLA)),
    "glm4_moe_lite": ("glm4_moe_lite", "Glm4MoeLiteForCausalLM", "Glm4MoeLiteConfig", dict(_MLA)),
    "mistral4": ("mistral4", "Mistral4ForCausalLM", "Mistral4Config",
                 {**_MLA, "head_dim": 16}),  # head_dim = nope + rope (the config derives the rotary part)
    "mistral_large4": ("mistral_large4", "MistralLarge4TextModel", "MistralLarge4TextConfig",
                       dict(_MLA, index_topk=4, index_head_dim=16, index_n_heads=2)),
    "lfm2_moe": ("lfm2_moe", "Lfm2MoeForCausalLM", "Lfm2MoeConfig",
                 dict(num_hidden_layers=3, num_dense_layers=1, layer_types=["conv", "full_attention", "conv"])),
    "afmoe": ("afmoe", "AfmoeForCausalLM", "AfmoeConfig", {}),
    "deepseek_v4": ("deepseek_v4", "DeepseekV4ForCausalLM", "DeepseekV4Config", {}),
    "qwen3_vl_moe": ("qwen3_vl_moe", "Qwen3VLMoeTextModel", "Qwen3VLMoeTextConfig", {}),
    "qwen3_omni_moe": ("qwen3_omni_moe", "Qwen3OmniMoeThinkerTextModel", "Qwen3OmniMoeTextConfig", {}),
    "glm4v_moe": ("glm4v_moe", "Glm4vMoeTextModel", "Glm4vMoeTextConfig",
                  dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[1, 1, 2],
                                            partial_rotary_factor=0.5))),
    "glm5_next": ("glm5_next", "Glm5NextTextModel", "Glm5NextTextConfig",
                  dict(num_key_value_heads=4, qk_rope_head_dim=0, qk_nope_head_dim=16, v_head_dim=16,
                       index_topk=16, index_kpool=4, index_head_dim=16, index_n_heads=2, linear_head_dim=16,
                       linear_num_heads=4, hc_mult=2, hc_sinkhorn_iters=3, mlp_layer_types=["sparse", "sparse"])),
    # text and vision expert blocks per layer; a text-only input runs the text ones
    "ernie4_5_vl_moe": ("ernie4_5_vl_moe", "Ernie4_5_VLMoeTextModel", "Ernie4_5_VLMoeTextConfig",
                        dict(moe_intermediate_size=[32, 32], moe_num_experts=4, moe_k=2,
                             mlp_layer_types=["sparse", "sparse"],
                             rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[3, 3, 2]))),
    "hy_v4_vl": ("hy_v4_vl", "HYV4VLTextModel", "HYV4VLTextConfig",
                 dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2]))),
    "muse_spark": ("muse_spark", "MuseSparkTextModel", "MuseSparkTextConfig", {}),
    "deepseek_ocr2": ("deepseek_ocr2", "DeepseekOcr2TextModel", "DeepseekOcr2TextConfig",
                      dict(mlp_layer_types=["sparse", "sparse"])),
    "unlimited_ocr": ("unlimited_ocr", "UnlimitedOcrTextModel", "UnlimitedOcrTextConfig", {}),
    "dots3_note": ("dots3_note", "Dots3NoteTextModel", "Dots3NoteTextConfig", dict(num_key_value_heads=4)),
    "diffusion_gemma": ("diffusion_gemma", "DiffusionGemmaEncoderTextModel", "DiffusionGemmaTextConfig", {}),
    "openai_privacy_filter": ("openai_privacy_filter", "OpenAIPrivacyFilterForTokenClassification",
                              "OpenAIPrivacyFilterConfig", {}),
    "axk1": ("axk1", "AXK1ForCausalLM", "AXK1Config", dict(_MLA)),
    "axk2": ("axk2", "AXK2ForCausalLM", "AXK2Config", dict(_MLA)),
    "glm_moe_dsa": ("glm_moe_dsa", "GlmMoeDsaForCausalLM", "GlmMoeDsaConfig",
                    dict(_MLA, index_topk=4, index_head_dim=16, index_n_heads=2)),
    "zaya": ("zaya", "ZayaForCausalLM", "ZayaConfig", dict(num_experts_per_tok=1)),  # the config allows top-1 only
    "beam": ("beam", "BeamForCausalLM", "BeamConfig", dict(mlp_layer_types=["sparse", "sparse"])),
}


def _config_has(config: PretrainedConfig, name: str) -> bool:
    """hasattr, except that heterogeneous (per-layer) configs raise on a per-layer name: it exists."""
    try:
        return hasattr(config, name)
    except Exception:  # AmbiguousGlobalPerLayerAttributeError
        return True


def hand_family_names() -> list[str]:
    return list(HAND_FAMILIES)


def hand_tiny_model(family: str, *, dtype: torch.dtype | None = None, seed: int = 0) -> torch.nn.Module:
    """A family from HAND_FAMILIES: GENERIC_SHRINK (names its config has) plus the family's overrides.
    Text models (no LM head) return last_hidden_state instead of logits."""
    import torch

    module, cls_name, config_name, extra = HAND_FAMILIES[family]
    cfg_cls = getattr(importlib.import_module(f"transformers.models.{module}.configuration_{module}"), config_name)
    cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), cls_name)
    base = cfg_cls()
    config = cfg_cls(**{**{k: v for k, v in GENERIC_SHRINK.items() if _config_has(base, k)}, **extra})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
        _randomize_experts(model, seed)
    return model.to(dtype or torch.float32).eval()


#: MoE families the generic shrink builds and runs (test_kernelize_families.py). Left out: families that need a
#: non-text input, do not build from a generic tiny config, or route so that the experts contribute nothing at
#: tiny sizes; FAMILIES has the seven main ones, HAND_FAMILIES those needing their own overrides.
GENERIC_FAMILIES = [
    "aria", "bailing_hybrid", "cohere2_moe", "dots1", "ernie4_5_moe", "exaone_moe", "flex_olmo", "flint",
    "glm4_moe", "granitemoe", "granitemoe_swa", "granitemoehybrid", "granitemoeshared", "hunyuan_v1_moe",
    "hy_v3", "hy_v4", "inkling", "inkling2", "inkling2_loop", "jamba", "kimi_linear", "kolibri1", "laguna",
    "lara_mini", "mellum", "mimo_v2_flash", "minimax", "minimax_m2", "minimax_m3_vl", "nemotron_h", "phimoe",
    "qwen3_5_moe", "qwen3_next", "qwen4_exp", "solar_open",
]


def llama(dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A tiny Llama causal LM: the dense-attention family (no experts)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(cfg).to(dtype or torch.float32).eval()


# -- Diffusers ---------------------------------------------------------------------------------------------------


def _seeded(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build()


def flux(dtype: torch.dtype | None = None, in_channels: int = 4) -> ModelInputs:
    """A one-block (+ one single block) Flux transformer and a batch of 2 for it."""
    import torch
    from diffusers import FluxTransformer2DModel

    model = _seeded(lambda: FluxTransformer2DModel(
        patch_size=1, in_channels=in_channels, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]))
    g = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(2, 16, in_channels, generator=g), encoder_hidden_states=torch.randn(
        2, 8, 32, generator=g), pooled_projections=torch.randn(2, 32, generator=g), timestep=torch.tensor([1.0, 0.5]),
        img_ids=torch.randn(16, 3, generator=g), txt_ids=torch.randn(8, 3, generator=g))
    return model, inputs


def sd3(dtype: torch.dtype | None = None) -> ModelInputs:
    """A two-block SD3.5-style transformer (block 0 has a second self-attention, attn2) and a batch of 2."""
    import torch
    from diffusers import SD3Transformer2DModel

    model = _seeded(lambda: SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
        caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64, out_channels=4,
        dual_attention_layers=(0,)))
    g = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(2, 4, 10, 10, generator=g), encoder_hidden_states=torch.randn(
        2, 7, 32, generator=g), pooled_projections=torch.randn(2, 64, generator=g), timestep=torch.tensor([1.0, 2.0]))
    return model, inputs


def wan(dtype: torch.dtype | None = None) -> ModelInputs:
    """A two-block Wan video transformer (self + cross attention) and one 3-frame batch."""
    import torch
    from diffusers import WanTransformer3DModel

    model = _seeded(lambda: WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32))
    g = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(1, 4, 3, 6, 6, generator=g),  # video: 3 frames of 6x6 latents
                  encoder_hidden_states=torch.randn(1, 9, 16, generator=g), timestep=torch.tensor([3]))
    return model, inputs


#: Diffusers family -> builder of (model, inputs).
DIFFUSERS_FAMILIES: dict[str, Callable[..., ModelInputs]] = {"flux": flux, "sd3": sd3, "wan": wan}


def diffusers_model(family: str, dtype: torch.dtype | None = None) -> ModelInputs:
    """A Diffusers family's tiny transformer in `dtype` (float32 default), eval mode, and its inputs in that dtype
    (the timestep stays as built)."""
    import torch

    dtype = dtype or torch.float32
    model, inputs = DIFFUSERS_FAMILIES[family](dtype)
    model = model.to(dtype).eval()
    return model, {k: v.to(dtype) if v.is_floating_point() and k != "timestep" else v for k, v in inputs.items()}
