"""A kernel caught writing weights on a later layer is kept out of every layer of the model: the layers validated
before the catch are put back too (bit for bit), the report says on which layer it was caught, and the forward never
runs it. The hostile kernels behave on the first layer they see and write from the second on: what they write is the
second layer's weights, so without the rule the first layer would keep running them and write the kept layer's
weights in every forward. The attention kernel writes only while serving the second layer: caught there alone, the
first layer is still kept out."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.layers import is_kernelized  # noqa: E402
from kernel_hub.layers.keep_out import ReportMark, caught_writing, keep_out_rows  # noqa: E402
from kernel_hub.layers.report import Kept, KernelizeReport, Replaced  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402
from tests.layers.test_kernelize_weights_guard import (  # noqa: E402
    OFF,
    attention_kernel,
    experts_kernel,
    ids,
    logits,
    raw,
    same_raw,
)


@pytest.fixture(scope="module")
def fa():
    return kh.get_kernel("kernel-hub/flash-attention-tpu", framework="torch", backend="cpu")


def _experts(model):
    return [m for _, m in model.named_modules() if type(m).__name__.endswith("Experts")]


def test_experts_kernel_caught_on_the_second_block_runs_on_no_block(rd):
    model = tiny.tiny_model("qwen3_moe", dtype=torch.float32)
    x = ids()
    before, weights = logits(model, x), raw(model)
    blocks = _experts(model)
    assert len(blocks) >= 2
    second = blocks[1]
    seen = {"second": False, "writes": 0}

    def moe(h, i, w, up, down, **kw):
        seen["second"] |= up is second.gate_up_proj or up.data_ptr() == second.gate_up_proj.data_ptr()
        if seen["second"]:  # from the second block on: writes that block's weights, whichever block it serves
            second.down_proj.data.mul_(0.5)
            seen["writes"] += 1
        return rd.moe_experts(h, i, w, up, down, **kw)

    model = kh.kernelize(model, mapping={**OFF, "moe_experts": experts_kernel(rd, moe)})
    report = kh.kernelize_report(model)
    paths = [n for n, m in model.named_modules() if type(m).__name__.endswith("Experts")]
    assert seen["writes"] >= 1  # it was caught writing (and the write was put back)
    assert not report.replaced and sorted(k.layer for k in report.kept) == sorted(paths)
    first = next(k for k in report.kept if k.layer == paths[0])
    assert first.reason.startswith(f"kept out of the whole model: on {paths[1]} the kernel was caught: "
                                   "the kernel modified the layer's weights down_proj"), first
    assert not is_kernelized(model)
    writes = seen["writes"]
    assert torch.equal(logits(model, x), before)  # the forward runs no block on the kernel ...
    assert seen["writes"] == writes and same_raw(raw(model), weights)  # ... so nothing writes the kept block


def test_attention_kernel_caught_on_the_second_layer_runs_on_no_layer(fa):
    model = tiny.llama(torch.float32)
    x = ids()
    before, weights = logits(model, x), raw(model)
    layers = [m for _, m in model.named_modules() if type(m).__name__.endswith("Attention")]
    assert len(layers) >= 2
    calls = {"n": 0, "writes": 0}

    def flash(*a, **kw):  # calls come layer by layer: serving the second layer, it writes that layer's o_proj
        calls["n"] += 1
        if calls["n"] % len(layers) == 2 % len(layers):
            layers[1].o_proj.weight.data.mul_(0.5)
            calls["writes"] += 1
        return fa.flash_attention(*a, **kw)

    report = kh.kernelize_report(kh.kernelize(model, mapping={**OFF, "attention": attention_kernel(fa, flash)}))
    paths = [n for n, m in model.named_modules() if type(m).__name__.endswith("Attention")]
    assert calls["writes"] >= 1 and not report.replaced
    assert sorted(k.layer for k in report.kept) == sorted(paths)
    assert next(k for k in report.kept if k.layer == paths[0]).reason.startswith(
        f"kept out of the whole model: on {paths[1]} the kernel was caught: the kernel modified the layer's weights")
    assert model.config._attn_implementation == "sdpa" and not is_kernelized(model)
    writes = calls["writes"]
    assert torch.equal(logits(model, x), before) and calls["writes"] == writes
    assert same_raw(raw(model), weights)


def _replaced(layer: str, kind: str) -> Replaced:
    return Replaced(layer=layer, kind=kind, repo_id="r", version="1", commit=None, variant=None, implementation="x",
                    route="forward", layout="", max_error=0.0)


def test_only_a_write_keeps_the_kind_out_and_only_that_kinds_rows_turn():
    report = KernelizeReport(model="m", mode="inference", backend="cpu")
    report.replaced.append(_replaced("earlier", "rms_norm"))  # another kind's row, before the mark
    mark = ReportMark.of(report)
    report.replaced += [_replaced("a", "attention"), _replaced("n", "rms_norm")]
    report.kept.append(Kept("b", "attention", "max error 0.5 above tolerance 0.001"))
    assert caught_writing(report, "attention", mark) is None  # a number is no catch
    report.kept.append(Kept("c", "attention", "the kernel modified its inputs query (a kernel writes only its "
                                              "output)"))
    report.kept.append(Kept("d", "rms_norm", "the kernel modified weights outside the layer x"))
    caught = caught_writing(report, "attention", mark)
    assert caught is not None and caught.layer == "c"
    turned = keep_out_rows(report, "attention", mark, caught)
    assert [r.layer for r in turned] == ["a"]
    assert [r.layer for r in report.replaced] == ["earlier", "n"]
    assert report.kept[-1].layer == "a" and "on c the kernel was caught" in report.kept[-1].reason
    assert caught_writing(report, "rms_norm", ReportMark(kept=0, replaced=0)).layer == "d"
