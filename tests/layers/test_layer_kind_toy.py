"""A layer kind needs its folder and its kernel's kernel.yaml entry, nothing in kernel_hub: a toy `scale` kind
(y = x * weight), declared in tests/layer_kind_scale/ with its kernel in tests/fixtures/scale_layer_kernel/, is handed
to kernelize with `kinds=`; the model's scale layer runs the kernel (checked against the layer first), the report has
the kind under its title, restore gives the original back bit for bit. And kernel_hub.layers.kinds' list of what a kind
needs is what the toy needed."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import kernel_hub as kh  # noqa: E402
from kernel_hub.layers import kinds  # noqa: E402
from kernel_hub.layers.kinds import BUILTIN_KINDS, LayerKind, layer_kernel_problems  # noqa: E402
from kernel_hub.package.metadata import load_metadata  # noqa: E402
from kernel_hub.report.html import families_section  # noqa: E402
from kernel_hub.report.schema import FamilyRow  # noqa: E402
from kernel_hub.verify.numerics import relative_error  # noqa: E402
from tests import layer_kind_scale as toy  # noqa: E402
from tests.layer_kind_scale.flow import ScaleHook  # noqa: E402

SRC = Path(kh.__file__).parent
TOY = Path(toy.__file__).parent
KERNEL = Path(__file__).parents[1] / "fixtures" / "scale_layer_kernel"
KINDS = (*BUILTIN_KINDS, toy.KIND)


class Scale(torch.nn.Module):
    """The user's layer: y = x * weight."""

    def __init__(self, hidden: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(hidden, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        return x * self.weight


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), Scale(16), torch.nn.Linear(16, 4))


def _kernel():
    return kh.get_local_kernel(KERNEL, framework="torch", backend="cpu")


def test_kernelize_swaps_a_kind_declared_outside_the_package_and_restore_gives_the_original_back():
    model = _model()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(x)
    params = {k: v.clone() for k, v in model.state_dict().items()}
    report = kh.kernelize_report(kh.kernelize(model, kinds=KINDS, mapping={"scale": _kernel()}))

    (row,) = report.replaced
    assert (row.layer, row.kind, row.repo_id, row.variant) == ("1", "scale", "test-org/scale-layer", "torch-cpu")
    assert row.max_error is not None and row.tolerance is not None and row.max_error <= row.tolerance
    hook = model[1].__dict__["forward"]
    assert isinstance(hook, ScaleHook)  # the model's layer is replaced, on this instance only
    with torch.no_grad():
        after = model(x)
    assert hook.calls == 1 and relative_error(after, before) <= row.tolerance

    counts = {r.kind: 1 for r in report.replaced}
    html = families_section([FamilyRow(family="toy", library="transformers", kind="moe", status="replaced",
                                       replaced=counts, kept={}, reasons=[], max_layer_error=row.max_error,
                                       output_error=None, restored=None, seconds=0.0)], KINDS)
    assert f"<th>{toy.KIND.title} replaced / kept</th>" in html and "scale layers" in html

    assert kh.restore(model)
    assert "forward" not in model[1].__dict__ and not kh.layers.is_kernelized(model)
    with torch.no_grad():
        assert torch.equal(model(x), before)
    assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())


def test_a_toy_kernel_that_disagrees_leaves_the_layer_and_the_built_ins_never_run_the_toy():
    wrong = type("Wrong", (), {"scale_layer": staticmethod(lambda x, weight: x * (weight + 1))})()
    model = _model()
    report = kh.kernelize_report(kh.kernelize(model, kinds=KINDS, mapping={"scale": wrong}))
    assert not report.replaced and [(k.layer, k.kind) for k in report.kept] == [("1", "scale")]
    assert report.kept[0].reason.startswith("validation failed: max error")
    assert "forward" not in model[1].__dict__ and not kh.layers.is_kernelized(model)

    assert toy.KIND.name not in {k.name for k in BUILTIN_KINDS}
    report = kh.kernelize_report(kh.kernelize(model))  # the built-ins only: nothing here is a kind they know
    assert not report.replaced and not report.kept and "forward" not in model[1].__dict__


def test_the_kind_keeps_to_its_contract_and_nothing_in_src_names_it():
    assert load_metadata(KERNEL).replaces == (toy.KIND.name,)  # its kernel's kernel.yaml entry
    assert layer_kernel_problems(_kernel(), toy.KIND.name, KINDS) == []
    assert layer_kernel_problems(object(), toy.KIND.name, KINDS) == [
        "scale_layer: missing (required; ScaleKernel, layer kind scale)"]
    assert not TOY.is_relative_to(SRC)
    assert not [p for p in SRC.rglob("*.py") if "layer_kind_scale" in p.read_text() or "scale_layer" in p.read_text()]


def _docstring_fields() -> tuple[list[str], list[str]]:
    """(the fields kinds/__init__.py's list says a kind needs, the ones it says only some kinds have)."""
    doc = kinds.__doc__ or ""
    needs = doc[doc.index("What a kind needs"):doc.index("A built-in kind is listed once")]
    required = re.findall(r"^  - `(\w+)`:", needs, flags=re.M)
    optional = re.findall(r"`(\w+)`", needs[needs.index("and, where it has them"):needs.index("the serving kernel")])
    return required, optional


def test_the_kinds_docstring_lists_what_the_toy_needed():
    required, optional = _docstring_fields()
    fields = dataclasses.fields(LayerKind)
    assert required == [f.name for f in fields if f.default is dataclasses.MISSING]
    assert optional == [f.name for f in fields if f.default is not dataclasses.MISSING]
    # what the toy set: every listed field, none of the others (they keep their defaults)
    assert [f.name for f in fields if getattr(toy.KIND, f.name) != f.default] == required
    assert all(getattr(toy.KIND, name) not in (None, "", ()) for name in required)
    # one folder: the declaration and every function it names live in the toy's own folder, outside kernel_hub
    assert Path(inspect.getfile(toy)).name == "__init__.py"
    assert {Path(inspect.getfile(fn)).parent for fn in (toy.KIND.apply, toy.KIND.restore)} == {TOY}
    # plus the kernel's kernel.yaml entry, which the list names too
    doc = kinds.__doc__ or ""
    assert "kernel.yaml `replaces: [<name>]`" in doc and load_metadata(KERNEL).replaces == (toy.KIND.name,)
