"""transformers' continuous batching (`model.generate_batch`, 5.25) on a kernelized model: the greedy tokens equal
transformers' own continuous batching on the model before kernelize (f32), on every family kernelize serves attention
for, with prompts of different lengths, 4-token pages and more requests than a batch holds. The kernel's hooks count
the calls they served (packed calls, no fallback); eager `generate` still runs on them; restore gives the model back.
transformers 5.25 takes its paged decode path (`flash_attn_with_kvcache` with a block table) only on CUDA/XPU: one test
lifts that gate to run the same requests through our paged kernel on CPU."""

from __future__ import annotations

import pytest

import kernel_hub as kh
from tests import tiny_models as tiny

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import GenerationConfig  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402

from kernel_hub.layers.kinds.attention import config_switch as at_config  # noqa: E402
from kernel_hub.layers.kinds.attention import dispatch as at  # noqa: E402
from kernel_hub.layers.kinds.attention.packed import PackedKernel  # noqa: E402

FAMILIES = ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "gpt_oss", "deepseek_v3")
LENGTHS = (3, 9, 5, 14, 2, 7)  # six requests, at most two per batch, 16 tokens per batch
NEW_TOKENS = 5
KEPT_CHECKED = ("qwen3_moe", "gpt_oss")  # previous implementation sdpa, eager


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 100, (n,), generator=g).tolist() for n in LENGTHS]


def _config(**extra) -> ContinuousBatchingConfig:
    return ContinuousBatchingConfig(page_size=4, num_blocks=64, max_batch_tokens=16, max_requests_per_batch=2,
                                    **extra)


GENERATION = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1, pad_token_id=0)


def _tokens(model, **config) -> list[list[int]]:
    out = model.generate_batch(_prompts(), generation_config=GENERATION, continuous_batching_config=_config(**config))
    return [out[k].generated_tokens for k in sorted(out, key=lambda r: int(r.rsplit("_", 1)[-1]))]


def _hooks(model) -> list[at.AttentionHook]:
    return [m.__dict__[at.HOOK_ATTR] for m in model.modules() if at.HOOK_ATTR in m.__dict__]


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_batch_on_a_kernelized_model_gives_transformers_tokens(family):
    model = tiny.tiny_model(family)
    ids = torch.tensor([_prompts()[1]])
    with torch.no_grad():
        logits_before = model(ids).logits
        generated_before = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    previous = model.config._attn_implementation
    before = _tokens(model)  # transformers' own continuous batching, no kernel-hub
    assert len(before) == len(LENGTHS) and all(len(t) == NEW_TOKENS for t in before)

    model = kh.kernelize(model)
    assert model.config._attn_implementation == at_config.IMPLEMENTATION_NAME
    hooks = _hooks(model)
    assert hooks and all(h.flash is not None for h in hooks), family  # every attention layer on the kernel
    served = sum(h.calls for h in hooks)
    assert _tokens(model) == before, family
    assert sum(h.calls for h in hooks) > served  # the kernel served the packed calls ...
    assert not any(h.fallbacks for h in hooks), [h.last_fallback for h in hooks]  # ... all of them

    # eager generate on the same kernelized model still runs on the kernel
    served = sum(h.calls for h in hooks)
    with torch.no_grad():
        assert torch.equal(model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0), generated_before)
    assert sum(h.calls for h in hooks) > served

    # a layer kept on its previous implementation (sdpa; eager for GPT-OSS) gets the per-sequence causal mask
    # transformers builds only for those names: the tokens stay transformers' own
    if family in KEPT_CHECKED:
        _kept_layers_keep_transformers_tokens(model, hooks, before)

    assert kh.restore(model)
    assert model.config._attn_implementation == previous
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits_before)


def _kept_layers_keep_transformers_tokens(model, hooks, before) -> None:
    kernels = [h.flash for h in hooks]
    for hook in hooks:
        hook.flash = None
    try:
        assert _tokens(model) == before
        assert all(h.fallbacks and "kept" in h.last_fallback for h in hooks)
    finally:
        for hook, flash in zip(hooks, kernels, strict=True):
            hook.flash = flash


def test_the_paged_decode_path_runs_our_kvcache_kernel_where_transformers_allows_it(monkeypatch):
    """transformers 5.25 enables its decode fast path (block table + flash_attn_with_kvcache) for flash 2/3 on CUDA
    or XPU only; with that gate lifted the same requests decode through our paged kernel on CPU, same tokens."""
    import transformers.generation.continuous_batching.initialization as init

    model = tiny.tiny_model("qwen3_moe")
    before = _tokens(model, max_blocks_per_request=8)  # sdpa: transformers turns the fast path off itself
    model = kh.kernelize(model)
    calls = {"varlen": 0, "kvcache": 0}
    for hook in _hooks(model):
        fns = hook.packed

        def varlen(*a, _f=fns.varlen, **k):
            calls["varlen"] += 1
            return _f(*a, **k)

        def kvcache(*a, _f=fns.kvcache, **k):
            calls["kvcache"] += 1
            assert k["block_table"].dim() == 2 and a[1].dim() == 4  # pages [num_pages, page_size, Hkv, D]
            return _f(*a, **k)

        hook.packed = PackedKernel(varlen, kvcache)
    monkeypatch.setattr(init, "ensure_decode_fast_path_is_available", lambda config, cb_config, user: None)
    assert _tokens(model, max_blocks_per_request=8) == before
    assert calls["kvcache"] > 0 and calls["varlen"] > 0, calls  # decode-only batches paged, the rest packed
