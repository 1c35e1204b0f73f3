"""A kernelized model's config still builds models: `type(model)(model.config)`, `AutoModelForCausalLM.from_config`
and assisted decoding (an assistant model built from that config) work with no network, and the models they build
compute what the model computed before kernelize (each config delegates to its previous implementation, GPT-OSS's eager
attention with sinks included). Continuous batching gets its flash-named implementation only while it runs."""

from __future__ import annotations

import socket

import pytest

import kernel_hub as kh
from tests import tiny_models as tiny

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402

from kernel_hub.layers.kinds.attention import config_switch  # noqa: E402
from kernel_hub.layers.kinds.attention import dispatch as at  # noqa: E402

FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss", "gemma4", "llama")
TOL = 1e-4


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection attempt fails the test (transformers would fetch a flash-attn kernel for a flash-named name)."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network touched: {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _model(family: str, seed: int = 0) -> torch.nn.Module:
    if family == "llama":
        torch.manual_seed(seed)
        return tiny.llama()
    return tiny.tiny_model(family, seed=seed)


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # one left-padded row
    return ids, mask


def _hooks(model) -> list[at.AttentionHook]:
    return [m.__dict__[at.HOOK_ATTR] for m in model.modules() if at.HOOK_ATTR in m.__dict__]


@pytest.mark.parametrize("family", FAMILIES)
def test_models_built_from_a_kernelized_config_compute_the_plain_model(family):
    model = _model(family)
    ids, mask = _ids()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        plain = model(ids, attention_mask=mask).logits
    model = kh.kernelize(model)
    assert _hooks(model) and any(h.flash is not None for h in _hooks(model)), family
    assert model.config._attn_implementation == config_switch.IMPLEMENTATION_NAME
    rows = mask.bool()
    for build in (lambda: type(model)(model.config), lambda: AutoModelForCausalLM.from_config(model.config)):
        twin = build().eval()
        twin.load_state_dict(state)
        assert not _hooks(twin)  # a new model: no layer of it is hooked
        with torch.no_grad():
            out = twin(ids, attention_mask=mask).logits
        assert torch.isfinite(out[rows]).all()
        assert (out[rows] - plain[rows]).abs().max().item() <= TOL, family
        # the kernelized model is untouched by the model built from its config
        assert model.config._attn_implementation == config_switch.IMPLEMENTATION_NAME
    with torch.no_grad():
        served = sum(h.calls for h in _hooks(model))
        kernelized = model(ids, attention_mask=mask).logits
    assert sum(h.calls for h in _hooks(model)) > served
    assert (kernelized[rows] - plain[rows]).abs().max().item() <= 1e-3


@pytest.mark.parametrize("family", ("qwen3_moe", "mixtral", "gpt_oss", "llama"))
def test_assisted_decoding_matches_greedy_search(family):
    model = kh.kernelize(_model(family))
    ids = _ids()[0][:1]  # transformers' assisted decoding takes one sequence
    gen = GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        greedy = model.generate(ids, generation_config=gen)
        # the same model (every candidate accepted), one built from its config, another kernelized one (random)
        for assistant in (model, type(model)(model.config).eval(), kh.kernelize(_model(family, seed=3))):
            assistant.generation_config.num_assistant_tokens = 2
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            assisted = model.generate(ids, generation_config=gen, assistant_model=assistant)
            assert torch.equal(assisted, greedy), family


def test_continuous_batching_runs_under_the_flash_name_and_gives_it_back():
    model = kh.kernelize(tiny.tiny_model("qwen3_moe"))
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values()
    hooks = _hooks(model)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    gen = GenerationConfig(max_new_tokens=3, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(page_size=4, num_blocks=16, max_batch_tokens=8, max_requests_per_batch=2)
    served = sum(h.calls for h in hooks)
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb)
    assert len(out) == 2 and sum(h.calls for h in hooks) > served
    assert {c._attn_implementation for c in configs} == {config_switch.IMPLEMENTATION_NAME}  # given back at stop
    type(model)(model.config)  # builds again after continuous batching
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    try:
        assert {c._attn_implementation for c in configs} == {config_switch.BATCHING_NAME}  # while a manager runs
    finally:
        manager.stop(block=True)
    assert {c._attn_implementation for c in configs} == {config_switch.IMPLEMENTATION_NAME}
    # switched away and back by the user: continuous batching runs on the kernel again
    model.set_attn_implementation("eager")
    model.set_attn_implementation(config_switch.IMPLEMENTATION_NAME)
    served = sum(h.calls for h in hooks)
    again = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb)
    assert sorted(again) == sorted(out) and sum(h.calls for h in hooks) > served
    assert [again[k].generated_tokens for k in sorted(again)] == [out[k].generated_tokens for k in sorted(out)]


def test_restore_gives_the_instance_dict_and_names_back_exactly():
    model = tiny.tiny_model("gpt_oss")
    before_dict = set(model.__dict__)
    names = {id(m): (type(m.config), m.config._attn_implementation) for m in model.modules() if hasattr(m, "config")}
    model = kh.kernelize(model)
    assert config_switch.BATCHING_ENTRY in model.__dict__
    copied = AutoModelForCausalLM.from_config(model.config)  # a copy made while kernelized
    kh.restore(model)
    assert set(model.__dict__) == before_dict
    assert {id(m): (type(m.config), m.config._attn_implementation)
            for m in model.modules() if hasattr(m, "config")} == names
    ids, mask = _ids()
    with torch.no_grad():
        assert torch.isfinite(copied(ids, attention_mask=mask).logits).all()  # the copy still runs after restore



class _Config:
    def __init__(self, name):
        self._attn_implementation_internal = name

    @property
    def _attn_implementation(self):
        return self._attn_implementation_internal


class _Manager:
    def __init__(self, model):
        self.model, self.seen = model, model.config._attn_implementation

    def stop(self):
        self.stopped = True


class _Model:
    def __init__(self):
        self.config = _Config(config_switch.IMPLEMENTATION_NAME)

    def init_continuous_batching(self):
        return _Manager(self)


def test_the_batching_entry_names_the_configs_while_a_manager_runs_and_follows_a_deep_copy():
    import copy

    model = _Model()
    model.__dict__[config_switch.BATCHING_ENTRY] = config_switch.BatchingEntry(model, [model.config])
    clone = copy.deepcopy(model)
    manager = clone.init_continuous_batching()
    assert manager.model is clone and manager.seen == config_switch.BATCHING_NAME  # the copy's own configs
    assert model.config._attn_implementation == config_switch.IMPLEMENTATION_NAME  # the original's untouched
    manager.stop()
    assert manager.stopped and clone.config._attn_implementation == config_switch.IMPLEMENTATION_NAME
    manager = model.init_continuous_batching()
    assert manager.model is model and model.config._attn_implementation == config_switch.BATCHING_NAME
    manager.stop()
    assert model.config._attn_implementation == config_switch.IMPLEMENTATION_NAME
