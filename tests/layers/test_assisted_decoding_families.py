"""transformers' `test_assisted_decoding_matches_greedy_search` (tests/generation/test_utils.py, the 5.x version: its
test files are not in the wheel) on kernelized tiny models of six families, both assistant types.

Written after its steps: seed 42, a batch of one, the model built with eager attention and then kernelized, `config =
model.config` (the kernelized model's config), greedy generate with scores, logits, hidden states and attentions
under a dynamic cache ("dynamic_full" in newer transformers; 5.25 calls it "dynamic"); the assistant is the same model
("same": every candidate accepted) or `model_class(config)` built from the kernelized config ("random": none
accepted), switched to eager as the test does; the assisted output must equal the greedy one (sequences exactly,
scores and logits within the test's tolerance, 1e-3 for MoE models and 1e-5 otherwise). Not carried over:
transformers' `set_config_for_less_flaky_test` (layer-norm epsilons) and its per-model tester configs
(tests/tiny_models' configs stand in)."""

from __future__ import annotations

import importlib

import pytest

import kernel_hub as kh
from tests import tiny_models as tiny

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM, set_seed  # noqa: E402

FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss", "olmoe", "qwen2_moe", "llama")


def _class_and_config(family: str):
    if family == "llama":
        return LlamaForCausalLM, LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=16, pad_token_id=0)
    module, cls_name, _, _ = tiny.FAMILIES[family]
    cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), cls_name)
    return cls, tiny.tiny_config(family)


@pytest.mark.parametrize("assistant_type", ["random", "same"])
@pytest.mark.parametrize("family", FAMILIES)
def test_assisted_decoding_matches_greedy_search(family, assistant_type):
    model_class, config = _class_and_config(family)
    set_seed(42)
    config._attn_implementation = "eager"  # the test forces eager attention to get attention weights
    config.is_decoder = True
    model = model_class._from_config(config, attn_implementation="eager").eval()
    model = kh.kernelize(model)
    assert kh.kernelize_report(model).changed, family
    config = model.config
    input_ids = torch.randint(3, config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(42))
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    generation_kwargs = {"eos_token_id": -1, "max_new_tokens": 4, "num_beams": 1, "do_sample": False,
                         "output_scores": True, "output_logits": True, "output_hidden_states": True,
                         "output_attentions": True, "return_dict_in_generate": True, "use_cache": True,
                         "cache_implementation": "dynamic"}
    processors = {"bad_words_ids": [[1, 0]], "repetition_penalty": 1.2, "remove_invalid_values": True}

    greedy = model.generate(**generation_kwargs, **inputs, **processors)

    assistant = model_class(config).eval() if assistant_type == "random" else model
    assistant.config._attn_implementation = "eager"
    assistant.generation_config.num_assistant_tokens = 2
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assisted = model.generate(**generation_kwargs, **inputs, **processors, assistant_model=assistant)

    tol = 1e-5 if family == "llama" else 1e-3
    assert torch.equal(greedy.sequences, assisted.sequences), family
    assert greedy.sequences.shape == (1, input_ids.shape[1] + 4)
    for a, b in [*zip(greedy.scores, assisted.scores, strict=True), *zip(greedy.logits, assisted.logits, strict=True)]:
        assert torch.isfinite(a[a > -1e30]).all()
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
