"""Tiny transformers MoE models built from configs with random weights, for the kernelize tests.

No downloads: each family is its config class with small sizes. Shapes stay distinct (hidden 64,
expert width 32, 8 experts) so a transposed or interleaved layout cannot pass by accident.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

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
                         v_head_dim=16, head_dim=8)),
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


def tiny_config(family: str, **overrides: Any) -> Any:
    module, _, config_name, extra = FAMILIES[family]
    cfg_mod = importlib.import_module(f"transformers.models.{module}.configuration_{module}")
    cfg_cls = getattr(cfg_mod, config_name)
    kwargs = {**_COMMON, **extra, **overrides}
    return cfg_cls(**kwargs)


def tiny_model(family: str, *, dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any) -> Any:
    """A random-weight causal LM of `family`, in eval mode, on CPU."""
    module, cls_name, _, _ = FAMILIES[family]
    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    config = tiny_config(family, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(mod, cls_name)(config)
        _randomize_experts(model, seed)
    return model.to(dtype).eval()


def _randomize_experts(model: Any, seed: int) -> None:
    """Some families initialise expert weights (and biases) to zero or constants; give every 3-D
    expert weight and bias real random values so a wrong layout cannot hide."""
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
)


def generic_tiny_model(family: str, *, dtype: torch.dtype = torch.float32, seed: int = 0) -> Any:
    """Any transformers MoE family shrunk by GENERIC_SHRINK (its first *ForCausalLM class)."""
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
    return model.to(dtype).eval()


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


def _config_has(config: Any, name: str) -> bool:
    """hasattr, except that heterogeneous (per-layer) configs raise on a per-layer name: it exists."""
    try:
        return hasattr(config, name)
    except Exception:  # AmbiguousGlobalPerLayerAttributeError
        return True


def hand_family_names() -> list[str]:
    return list(HAND_FAMILIES)


def hand_tiny_model(family: str, *, dtype: torch.dtype = torch.float32, seed: int = 0) -> Any:
    """A family from HAND_FAMILIES: GENERIC_SHRINK (names its config has) plus the family's overrides.
    Text models (no LM head) return last_hidden_state instead of logits."""
    module, cls_name, config_name, extra = HAND_FAMILIES[family]
    cfg_cls = getattr(importlib.import_module(f"transformers.models.{module}.configuration_{module}"), config_name)
    cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), cls_name)
    base = cfg_cls()
    config = cfg_cls(**{**{k: v for k, v in GENERIC_SHRINK.items() if _config_has(base, k)}, **extra})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
        _randomize_experts(model, seed)
    return model.to(dtype).eval()
