"""kernelize's attention state when two threads work at once: a validation probe belongs to the model it validates
(two models probed at once each feed their own; interleaved so both probes are on before either model runs), and
the config subclass that accepts attention-weight requests is made once per config class even when two threads ask
for it together (both configs share it and pickle by its name)."""

from __future__ import annotations

import contextlib
import pickle
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.layers.kinds.attention import config_switch as at_config  # noqa: E402
from kernel_hub.layers.kinds.attention import dispatch as at  # noqa: E402
from kernel_hub.layers.kinds.attention.find import attention_configs  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

FLASH_REPO = "kernel-hub/flash-attention-tpu"


def _in_threads(*targets) -> None:
    """Run each target in its own thread; re-raise the first failure here."""
    errors: list[BaseException] = []

    def guarded(target):
        try:
            target()
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _attention_module_ids(model) -> set[int]:
    return {id(m) for m in model.modules() if type(m).__name__.endswith("Attention")}


def test_each_model_validated_at_once_feeds_its_own_probe():
    fa = kh.get_kernel(FLASH_REPO, framework="torch", backend="cpu")
    at.register()
    models = [tiny.tiny_model("qwen3_moe").eval() for _ in range(2)]
    probes = [at.AttentionProbe(flash=fa.flash_attention) for _ in models]
    both_on = threading.Barrier(2, timeout=60)
    x = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(0))

    def validate(model, probe):
        def run():
            model.set_attn_implementation(at_config.IMPLEMENTATION_NAME)  # the name set_attn_implementation takes
            configs = attention_configs(model)
            at.set_probe(configs, probe)
            try:
                both_on.wait()  # the other model's probe is on too: one process-wide probe would hold only one
                with torch.no_grad():
                    model(input_ids=x, use_cache=False)
            finally:
                at.set_probe(configs, None)
        return run

    _in_threads(*(validate(m, p) for m, p in zip(models, probes, strict=True)))
    for model, probe in zip(models, probes, strict=True):
        assert set(probe.modules) == _attention_module_ids(model) != set()
        assert not probe.failures and all(probe.errors.values()), probe.failures
    assert not at._PROBES  # both switched off again


def test_the_accepting_class_is_made_once_when_two_threads_ask_together(monkeypatch):
    from transformers import PretrainedConfig

    class FreshConfig(PretrainedConfig):  # a class no accepting subclass exists for yet
        model_type = "kernel_hub_thread_test"

    # Both threads meet inside the making of the subclass if both get there: a lock lets only one in, so the other
    # is still waiting outside when the meeting times out (a short wait), and then finds the class made.
    inside = threading.Barrier(2, timeout=1)
    real_check = at_config._eager_check

    def meeting_check(check):
        with contextlib.suppress(threading.BrokenBarrierError):
            inside.wait()
        return real_check(check)

    monkeypatch.setattr(at_config, "_eager_check", meeting_check)
    configs = [FreshConfig(), FreshConfig()]
    _in_threads(*(lambda c=c: at_config.accept_weight_requests(c) for c in configs))
    made = type(configs[0])
    assert type(configs[1]) is made and made.__bases__ == (FreshConfig,)
    assert getattr(at_config.ACCEPTING, made.__qualname__.removeprefix("ACCEPTING.")) is made
    for cfg in configs:
        assert type(pickle.loads(pickle.dumps(cfg))) is made
