"""HF `kernels` habits in kh.kernelize: `Mode` flags, LayerRepository / LocalLayerRepository mapping values (alone,
per device, per mode), HF layer names as keys, and a strict kernelize (`strict=True` / `use_fallback=False`) that
raises naming the layer instead of keeping it, leaving the model as it was."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
kernels = pytest.importorskip("kernels")

import kernel_hub as kh  # noqa: E402
from kernel_hub.errors import KernelHubError, KernelizeStrictError  # noqa: E402
from kernel_hub.layers import hf_compat as hf  # noqa: E402
from kernel_hub.layers.kinds import BUILTIN_KINDS  # noqa: E402
from kernel_hub.layers.report import Kept, KernelizeReport, strict_failures  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

Mode, LayerRepository, LocalLayerRepository = kernels.Mode, kernels.LayerRepository, kernels.LocalLayerRepository
KINDS = BUILTIN_KINDS
MOE = "kernel-hub/ragged-dot-tpu"
RAGGED_DOT_SOURCE = Path(__file__).resolve().parents[2] / "kernels" / "pallas" / "ragged_dot"
DEFAULTS_OFF = {"attention": None, "rms_norm": None}


def repo(name: str = MOE, **kw) -> LayerRepository:
    return LayerRepository(repo_id=name, layer_name="MoEExperts", **({"version": 1} | kw))


# -- the decisions, on plain values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "want"), [
    (Mode.INFERENCE, "inference"), (Mode.TRAINING, "training"), ("inference", "inference"), ("training", "training")])
def test_modes_that_mean_ours(mode, want) -> None:
    assert hf.mode_name(mode)[0] == want


@pytest.mark.parametrize(("mode", "needle"), [
    (Mode.INFERENCE | Mode.TORCH_COMPILE, "TORCH_COMPILE"), (Mode.TRAINING | Mode.TORCH_COMPILE, "TORCH_COMPILE"),
    (Mode.FALLBACK, "FALLBACK marks a mapping entry"), ("serving", "mode must be one of"), (3, "mode must be one of")])
def test_modes_refused_with_the_reason(mode, needle) -> None:
    name, why = hf.mode_name(mode)
    assert name is None and needle in why
    with pytest.raises(KernelHubError, match=needle):
        hf.check_mode_arg(mode)


@pytest.mark.parametrize(("key", "kind"), [
    ("RMSNorm", "rms_norm"), ("MegaBlocksMoeMLP", "moe_experts"), ("MoEExperts", "moe_experts"),
    ("Qwen3MoeExperts", "moe_experts"), ("GptOssExperts", "moe_experts"), ("attention", "attention")])
def test_hf_layer_names_are_kinds(key, kind) -> None:
    assert hf.kind_for_key(key, KINDS)[0] == kind


@pytest.mark.parametrize("key", ["LigerRMSNorm", "rotary_pos_emb", "experts", "SiluAndMul"])
def test_other_layer_names_are_refused_listing_the_known(key) -> None:
    kind, why = hf.kind_for_key(key, KINDS)
    assert kind is None and f"unknown layer kind {key!r}" in why and "RMSNorm" in why and "moe_experts" in why


def test_layer_repository_values_alone_per_device_and_per_mode() -> None:
    one = repo(trust_remote_code=True)
    want = {"repo_id": MOE, "version": 1, "revision": None, "trust_remote_code": True}
    cases = {
        "alone": one,
        "device string": {"cpu": one, "cuda": repo("other/x")},
        "Device": {kernels.Device(type="cpu"): one},
        "device then mode": {"cpu": {Mode.TRAINING: repo("other/x"), Mode.INFERENCE: one}},
        "mode with compile": {Mode.INFERENCE | Mode.TORCH_COMPILE: one, Mode.TRAINING: repo("other/x")},
        "fallback": {Mode.TRAINING: repo("other/x"), Mode.FALLBACK: one},
    }
    for label, value in cases.items():
        got, unfit = hf.normalize_mapping({"MoEExperts": value}, KINDS, "cpu", "inference")
        assert got == {"moe_experts": want} and unfit == {}, label
    revision = repo(version=None, revision="v1.7.2")
    got, _ = hf.normalize_mapping({"moe_experts": revision}, KINDS, "cpu", "inference")
    assert got["moe_experts"] == {"repo_id": MOE, "version": None, "revision": "v1.7.2"}


def test_nothing_for_this_device_or_mode_says_why() -> None:
    got, unfit = hf.normalize_mapping({"RMSNorm": {"cuda": repo()}, "MegaBlocksMoeMLP": {Mode.TRAINING: repo()}},
                                      KINDS, "cpu", "inference")
    assert got == {"rms_norm": None, "moe_experts": None}
    assert "no entry for cpu (given: cuda)" in unfit["rms_norm"]
    assert "no entry for Mode.INFERENCE (given: TRAINING)" in unfit["moe_experts"]


def test_local_layer_repository_is_a_local_folder() -> None:
    local = LocalLayerRepository(repo_path=RAGGED_DOT_SOURCE, layer_name="MoEExperts")
    got, _ = hf.normalize_mapping({"Qwen3MoeExperts": local}, KINDS, "cpu", "inference")
    assert got == {"moe_experts": hf.LocalSpec(RAGGED_DOT_SOURCE)}


def test_two_keys_for_one_kind_are_refused() -> None:
    with pytest.raises(KernelHubError, match="'RMSNorm' and 'rms_norm' both name the layer kind rms_norm"):
        hf.normalize_mapping({"RMSNorm": None, "rms_norm": "a/b"}, KINDS, "cpu", "inference")


@pytest.mark.parametrize(("strict", "fallback", "want"), [
    (False, None, False), (True, None, True), (False, False, True), (False, True, False),
    (False, kernels.KernelizeFallback.NONE, True), (False, kernels.KernelizeFallback.ALL, False),
    (False, kernels.KernelizeFallback.DEFAULT, False)])
def test_strict_from_use_fallback(strict, fallback, want) -> None:
    assert hf.strict_from(strict, fallback) is want


def test_strict_and_fallback_allowed_contradict() -> None:
    with pytest.raises(KernelHubError, match="contradict"):
        hf.strict_from(True, True)


def test_strict_failures_read_rows_and_kind_notes_but_not_skipped_kinds() -> None:
    report = KernelizeReport(model="M", mode="inference", backend="cpu",
                             kept=[Kept("a.experts", "moe_experts", "validation failed: x"),
                                   Kept("a.norm", "rms_norm", "no kernel mapped")],
                             notes=["attention unchanged: a/b did not load: boom", "experts implementation switched"])
    assert strict_failures(report) == [("a.experts", "validation failed: x"), ("a.norm", "no kernel mapped"),
                                       ("every attention layer", "a/b did not load: boom")]
    assert strict_failures(report, frozenset({"rms_norm", "attention"})) == [("a.experts", "validation failed: x")]


# -- on a tiny model ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel():
    return kh.get_kernel(MOE, framework="torch", backend="cpu")


def ids(seed: int = 0):
    return torch.randint(3, 120, (2, 9), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(x).logits.float()


def test_hf_mode_key_and_layer_repository_kernelize_the_experts() -> None:
    model = tiny.tiny_model("qwen3_moe")
    x = ids(1)
    before = logits(model, x)
    mapping = {**DEFAULTS_OFF, "Qwen3MoeExperts": {"cpu": {Mode.INFERENCE: repo()}}}
    model = kh.kernelize(model, mode=Mode.INFERENCE, mapping=mapping)
    report = kh.kernelize_report(model)
    assert [r.repo_id for r in report.replaced] == [MOE, MOE] and report.mode == "inference" and not report.kept
    after = logits(model, x)
    assert torch.isfinite(after).all()
    assert ((after - before).abs().max() / before.abs().max()).item() <= 1e-4
    kh.restore(model)


def test_local_layer_repository_kernelizes_from_the_source_folder(tmp_path: Path) -> None:
    """A copy of the ragged dot's folder with its own version: the report names that version, so the kernel came
    from the folder named (not the registry's copy)."""
    folder = tmp_path / "ragged_dot"
    shutil.copytree(RAGGED_DOT_SOURCE, folder, ignore=shutil.ignore_patterns("__pycache__", "tests"))
    meta = folder / "kernel.yaml"
    meta.write_text(re.sub(r"(?m)^version: .*$", "version: 9.9.1", meta.read_text()))
    model = tiny.tiny_model("olmoe")
    local = LocalLayerRepository(repo_path=folder, layer_name="MoEExperts")
    report = kh.kernelize_report(kh.kernelize(model, mapping={**DEFAULTS_OFF, "MoEExperts": local}))
    assert [r.version for r in report.replaced] == ["9.9.1", "9.9.1"] and not report.kept
    kh.restore(model)


def test_a_local_folder_without_kernel_yaml_is_refused(tmp_path: Path) -> None:
    model = tiny.tiny_model("olmoe")
    local = LocalLayerRepository(repo_path=tmp_path, layer_name="MoEExperts")
    with pytest.raises(KernelHubError, match="holds no kernel.yaml"):
        kh.kernelize(model, mapping={**DEFAULTS_OFF, "moe_experts": local})
    assert not kh.layers.is_kernelized(model)


@pytest.mark.parametrize("how", [{"strict": True}, {"use_fallback": False},
                                 {"use_fallback": kernels.KernelizeFallback.NONE}])
def test_strict_raises_naming_the_layer_and_leaves_the_model(how, kernel) -> None:
    model = tiny.tiny_model("mixtral")
    x = ids(2)
    before = logits(model, x)
    impl = model.get_experts_implementation()
    bad = model.model.layers[1].mlp.experts

    def sometimes_wrong(hidden, index, weights, gate_up, *args, **kwargs):
        out = kernel.moe_experts(hidden, index, weights, gate_up, *args, **kwargs)
        return out + 1.0 if gate_up is bad.gate_up_proj else out

    wrapped = type("K", (), {"__kernel_hub__": kernel.__kernel_hub__, "ragged_dot": kernel.ragged_dot,
                             "moe_experts": staticmethod(sometimes_wrong)})()
    with pytest.raises(KernelizeStrictError) as exc:
        kh.kernelize(model, mapping={**DEFAULTS_OFF, "moe_experts": wrapped}, **how)
    message = str(exc.value)
    assert "model.layers.1.mlp.experts: validation failed" in message and "\n" not in message
    assert "model.layers.0" not in message  # the layer that passed is not blamed
    assert not kh.layers.is_kernelized(model) and model.get_experts_implementation() == impl
    assert torch.equal(logits(model, x), before)
    assert kh.kernelize_report(model).kept[0].layer == "model.layers.1.mlp.experts"  # what was tried, readable


def test_strict_raises_when_the_kernel_does_not_load() -> None:
    model = tiny.tiny_model("olmoe")
    with pytest.raises(KernelizeStrictError, match="kernel-hub/no-such-kernel did not load"):
        kh.kernelize(model, mapping={**DEFAULTS_OFF, "moe_experts": "kernel-hub/no-such-kernel"}, strict=True)
    assert not kh.layers.is_kernelized(model)


def test_strict_leaves_kinds_mapped_to_none_alone() -> None:
    model = tiny.tiny_model("olmoe")
    report = kh.kernelize_report(kh.kernelize(model, mapping={**DEFAULTS_OFF, "moe_experts": None}, strict=True))
    assert not report.replaced and report.kept  # kept on purpose: no raise
    assert not kh.layers.is_kernelized(model)
