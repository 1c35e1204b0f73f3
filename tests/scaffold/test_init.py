"""`kernel-hub init`: every template renders a kernel folder that loads and validates with nothing beside it, and
every bad input is refused with one line before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernel_hub as kh
from kernel_hub import cli
from kernel_hub.package.metadata import load_metadata
from kernel_hub.scaffold import TEMPLATES, InitError, init, plan_init, render


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


@pytest.mark.parametrize("template", TEMPLATES)
def test_a_fresh_kernel_validates_on_cpu_with_nothing_beside_it(template, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path / "cache"))
    folder = init(f"fresh_{template}", tmp_path / "authoring", template, repo_id="acme/fresh")
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no _common beside it, no staging left
    meta = load_metadata(folder)
    assert meta.repo_id == "acme/fresh" and meta.python_name == f"fresh_{template}"
    pkg = meta.python_name
    for name in ("kernel.yaml", "README.md", f"{pkg}/validation.py", f"{pkg}/tpu_cases.py", f"{pkg}/torch_api.py",
                 f"{pkg}/torch_tpu_api.py", f"tests/test_{pkg}.py"):
        assert (folder / name).is_file(), name
    assert "@@" not in "".join(p.read_text() for p in folder.rglob("*") if p.is_file())
    module = kh.get_local_kernel(folder, backend="cpu")
    assert (module.__kernel_hub__.path / "_vendor" / "dispatch.py").is_file()  # vendored from kernel-hub's copy
    report = kh.validate(module, backend="cpu", tags=("edge",))
    assert report.passed and report.cases, str(report)


def test_the_same_name_renders_the_same_files():
    a = render(plan_init("same", "/nonexistent-dir-for-plan", "matmul"))
    b = render(plan_init("same", "/nonexistent-dir-for-plan", "matmul"))
    assert a == b and "same/api.py" in a and "tests/test_same.py" in a


BAD = [
    ("9lives", {}, "kernel name"),
    ("has-dash", {}, "kernel name"),
    ("class", {}, "kernel name"),
    ("_hidden", {}, "private"),
    ("kernels", {}, "imports use"),
    ("ok", {"template": "conv"}, "unknown --op"),
    ("ok", {"repo_id": "no-slash"}, "ORG/NAME"),
    ("exists", {}, "already exists"),
    ("ok", {"directory": "a_file"}, "is a file"),
]


@pytest.mark.parametrize(("name", "kw", "needle"), BAD, ids=[f"{n}-{k}" for n, k, _ in BAD])
def test_bad_input_is_refused_and_writes_nothing(name, kw, needle, tmp_path, capsys):
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "keep.txt").write_text("mine")
    (tmp_path / "a_file").write_text("x")
    kw = {**kw, "directory": tmp_path / kw["directory"]} if "directory" in kw else {**kw, "directory": tmp_path}
    before = _tree(tmp_path)
    with pytest.raises(InitError, match=needle):
        init(name, **kw)
    assert _tree(tmp_path) == before
    assert (tmp_path / "exists" / "keep.txt").read_text() == "mine"
    argv = ["init", name, "--dir", str(kw["directory"])]
    argv += ["--template", kw["template"]] if "template" in kw else []
    argv += ["--repo", kw["repo_id"]] if "repo_id" in kw else []
    assert cli.main(argv) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert _tree(tmp_path) == before
