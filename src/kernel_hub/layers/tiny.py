"""Tiny transformers MoE models built from configs with random weights (tests, demo, bench).

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
