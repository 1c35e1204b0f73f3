"""kernelize across the transformers 5.25 MoE families that route experts through ExpertsInterface.

Each family is its own config class shrunk to tiny sizes (kernel_hub.report.models.GENERIC_SHRINK) with
random expert weights. Families left out here either need a non-text input (vision/omni models), do not
build from a generic tiny config, or route so that the experts contribute nothing at tiny sizes; the
seven main families have hand-written configs in test_kernelize.py. Families the generic shrink cannot
build or run have their own overrides in kernel_hub.report.models.HAND_FAMILIES (test_hand_family); vision
and omni models are tested through their text model.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kernel_hub as kh  # noqa: E402
from kernel_hub.layers.kinds.experts.find import routes_through_interface  # noqa: E402
from tests import tiny_models as tiny  # noqa: E402

# These tests pin the MoE path: attention stays on its default (test_kernelize_attention.py covers it).
pytestmark = pytest.mark.usefixtures("experts_only")


GENERIC_FAMILIES = tiny.GENERIC_FAMILIES


@pytest.fixture(scope="module")
def kernel():
    return kh.get_kernel("kernel-hub/ragged-dot-tpu", framework="torch", backend="cpu")


@pytest.mark.parametrize("family", GENERIC_FAMILIES)
def test_generic_family(family, kernel):
    import importlib

    if importlib.util.find_spec(f"transformers.models.{family}") is None:
        pytest.skip(f"{family} is not in this transformers")
    model = tiny.generic_tiny_model(family)
    x = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))

    def logits():
        with torch.no_grad():
            return model(input_ids=x, use_cache=False).logits

    before = logits()
    calls = []
    spy = type("Spy", (), {
        "__kernel_hub__": kernel.__kernel_hub__,
        "ragged_dot": staticmethod(kernel.ragged_dot),
        "moe_experts": staticmethod(lambda *a, **k: calls.append(1) or kernel.moe_experts(*a, **k)),
    })()
    report = kh.kernelize_report(kh.kernelize(model, mapping={"moe_experts": spy}))
    interface_blocks = [n for n, m in model.named_modules() if routes_through_interface(m)]
    assert sorted(r.layer for r in report.replaced) == sorted(interface_blocks) and interface_blocks
    # Anything kept is a block with another call contract (e.g. shared experts taking extra inputs).
    assert all("does not take (hidden_states, top_k_index, top_k_weights)" in k.reason for k in report.kept)
    n = len(calls)
    after = logits()
    assert len(calls) - n == len(interface_blocks)
    assert ((after - before).abs().max() / before.abs().max()).item() <= 1e-4
    kh.restore(model)
    assert torch.equal(logits(), before)


def _output(model, x):
    with torch.no_grad():
        out = model(input_ids=x, use_cache=False)
    logits = getattr(out, "logits", None)
    return (logits if logits is not None else out.last_hidden_state).float()


@pytest.mark.parametrize("family", tiny.hand_family_names())
def test_hand_family(family, kernel):
    import importlib

    if importlib.util.find_spec(f"transformers.models.{family}") is None:
        pytest.skip(f"{family} is not in this transformers")
    model = tiny.hand_tiny_model(family)
    x = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    blocks = {n: m for n, m in model.named_modules() if routes_through_interface(m)}
    assert blocks
    # Which blocks one forward runs (a text-only input skips e.g. ernie4_5_vl_moe's vision experts).
    ran: list[str] = []
    hooks = [m.register_forward_hook(lambda *_, n=n: ran.append(n)) for n, m in blocks.items()]
    before = _output(model, x)
    for h in hooks:
        h.remove()
    assert ran

    calls, zero = [], [False]

    def moe_experts(*args, **kwargs):
        calls.append(1)
        out = kernel.moe_experts(*args, **kwargs)
        return out * 0 if zero[0] else out

    spy = type("Spy", (), {
        "__kernel_hub__": kernel.__kernel_hub__,
        "ragged_dot": staticmethod(kernel.ragged_dot),
        "moe_experts": staticmethod(moe_experts),
    })()
    report = kh.kernelize_report(kh.kernelize(model, mapping={"moe_experts": spy}))
    assert sorted(r.layer for r in report.replaced) == sorted(blocks) and not report.kept
    n = len(calls)
    after = _output(model, x)
    assert len(calls) - n == len(ran)  # every expert block the forward reaches ran on the kernel
    assert ((after - before).abs().max() / before.abs().max()).item() <= 1e-4
    zero[0] = True  # the experts must matter, or the comparison above proves nothing
    without = _output(model, x)
    zero[0] = False
    assert ((without - before).abs().max() / before.abs().max()).item() >= 1e-2
    kh.restore(model)
    assert torch.equal(_output(model, x), before)


def test_ungated_family_layout_is_read():
    report = kh.kernelize_report(kh.kernelize(tiny.generic_tiny_model("nemotron_h")))
    assert {r.layout for r in report.replaced} == {"[E,2I,H], ungated"}


def test_transposed_family_layout_is_read():
    report = kh.kernelize_report(kh.kernelize(tiny.generic_tiny_model("aria")))
    assert {r.layout for r in report.replaced} == {"[E,H,2I], gate/up concatenated"}
