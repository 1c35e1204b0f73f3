"""Loading from the embedded registry and local folders: versions, unique modules, bad inputs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import kernel_hub as kh
from kernel_hub.errors import (
    IntegrityError,
    KernelHubError,
    KernelImportError,
    MetadataError,
    UnsafeNameError,
    VersionSpecError,
)
from kernel_hub.load.loader import import_build
from kernel_hub.sources.base import LocalSource
from tests.toy_folder import set_version


def test_get_kernel_default_spec_major_and_range(toy_registry):
    by_default = kh.get_kernel("test-org/toy-scale", backend="cpu")
    by_major = kh.get_kernel("test-org/toy-scale", version=1, backend="cpu")
    by_range = kh.get_kernel("test-org/toy-scale", version=">=1.0,<2", backend="cpu")
    assert by_default is by_major is by_range  # one commit, one variant: one module
    info = by_default.__kernel_hub__
    assert (info.repo_id, info.version, info.variant) == ("test-org/toy-scale", "1.2.0", "jax-cpu")
    np.testing.assert_allclose(by_default.scale(np.ones(3), 4.0), 4.0)
    assert by_default.__all__ == ["FLAVOUR", "scale"]


def test_torch_framework_gets_the_torch_entry(toy_registry):
    torch = pytest.importorskip("torch")
    mod = kh.get_kernel("test-org/toy-scale", version=1, framework="torch", backend="cpu")
    assert mod.__kernel_hub__.variant == "torch-cpu" and mod.FLAVOUR == "torch"
    out = mod.scale(torch.ones(2), 5.0)
    assert isinstance(out, torch.Tensor) and out.tolist() == [5.0, 5.0]


def test_two_versions_live_in_one_process(toy_kernel, tmp_path):
    import shutil

    v2 = tmp_path / "toy_v2"
    shutil.copytree(toy_kernel, v2)
    set_version(v2, "2.0.0")
    (v2 / "toy_scale/ops.py").write_text(
        (v2 / "toy_scale/ops.py").read_text().replace("* np.float32(factor)", "* np.float32(factor) + 1")
    )
    one = kh.get_local_kernel(toy_kernel, backend="cpu")
    two = kh.get_local_kernel(v2, backend="cpu")
    assert one.__name__ != two.__name__ and one.__name__ in sys.modules and two.__name__ in sys.modules
    assert (one.__kernel_hub__.version, two.__kernel_hub__.version) == ("1.2.0", "2.0.0")
    assert float(one.scale(np.ones(1), 2.0)[0]) == 2.0
    assert float(two.scale(np.ones(1), 2.0)[0]) == 3.0  # its own ops module, not v1's


def test_has_kernel(toy_registry):
    assert kh.has_kernel("test-org/toy-scale", backend="cpu")
    assert not kh.has_kernel("test-org/toy-scale", version=">=5")
    assert not kh.has_kernel("test-org/no-such-kernel", version=1)
    assert not kh.has_kernel("test-org/toy-scale", backend="cuda")


def test_unknown_repo_is_one_clear_error(toy_registry):
    with pytest.raises(KernelHubError, match=r"Hub at http://127.0.0.1:9: listing refs for test-org/nope"):
        kh.get_kernel("test-org/nope", version=1)  # not in the registry: the Hub is asked, one line
    with pytest.raises(VersionSpecError, match="pass version= or revision="):
        kh.get_kernel("test-org/nope")
    with pytest.raises(UnsafeNameError, match="ORG/NAME"):
        kh.get_kernel("no-slash", version=1)


def test_bad_spec(toy_registry):
    with pytest.raises(VersionSpecError, match="PEP 440"):
        kh.get_kernel("test-org/toy-scale", version=">=1,,2")


def test_no_variant_error_carries_trace(toy_registry):
    from kernel_hub.errors import NoVariantError

    with pytest.raises(NoVariantError) as err:
        kh.get_kernel("test-org/toy-scale", version=1, backend="cuda")
    assert "jax-tpu" in str(err.value) and "backend tpu, this system is cuda" in str(err.value)


def test_missing_and_malformed_metadata(toy_kernel):
    (toy_kernel / "kernel.yaml").write_text("name: [unclosed\n")
    with pytest.raises(MetadataError, match="malformed YAML"):
        kh.get_local_kernel(toy_kernel)
    (toy_kernel / "kernel.yaml").unlink()
    with pytest.raises(MetadataError, match="no kernel.yaml"):
        kh.get_local_kernel(toy_kernel)


def test_missing_field_is_named(toy_kernel):
    meta = toy_kernel / "kernel.yaml"
    meta.write_text(meta.read_text().replace("repo_id: test-org/toy-scale\n", ""))
    with pytest.raises(MetadataError, match="missing required field 'repo_id'"):
        kh.get_local_kernel(toy_kernel)


def test_kernel_raising_on_import_leaves_nothing_behind(toy_kernel):
    (toy_kernel / "toy_scale/ops.py").write_text("raise RuntimeError('boom at import')\n")
    before = set(sys.modules)
    with pytest.raises(KernelImportError, match="import failed: RuntimeError: boom at import"):
        kh.get_local_kernel(toy_kernel, backend="cpu")
    assert {m for m in set(sys.modules) - before if m.startswith("_kernel_hub_")} == set()


def test_file_changed_after_digest_is_refused(toy_kernel):
    source = LocalSource(toy_kernel)
    variant = source.metadata.variant("jax-cpu")
    build = source.fetch(source.metadata.repo_id, source.commit, variant)
    (toy_kernel / "toy_scale/ops.py").write_text("import os\nos.system('echo pwned')\n")
    with pytest.raises(IntegrityError, match=r"ops.py has sha256"):
        import_build(build)


def test_file_added_after_digest_is_refused(toy_kernel):
    source = LocalSource(toy_kernel)
    build = source.fetch(source.metadata.repo_id, source.commit, source.metadata.variant("jax-cpu"))
    Path(toy_kernel / "toy_scale/extra.py").write_text("x = 1\n")
    with pytest.raises(IntegrityError, match="unexpected file extra.py"):
        import_build(build)


def test_lazy_import_keeps_frameworks_out():
    import subprocess

    code = (
        "import kernel_hub, sys; kernel_hub.plan_load; kernel_hub.load_registry()\n"
        "print(sorted(m for m in ('jax', 'torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_get_kernel_through_a_lock_file(toy_registry, toy_kernel, tmp_path):
    from kernel_hub.load.lock import lock

    lockfile = tmp_path / "kernel-hub.lock"
    lock(["test-org/toy-scale"], backend="cpu", path=lockfile)
    mod = kh.get_kernel("test-org/toy-scale", lockfile=lockfile)
    assert mod.__kernel_hub__.variant == "jax-cpu" and float(mod.scale(np.ones(1), 2.0)[0]) == 2.0
    with pytest.raises(VersionSpecError, match="lock file fixes the version"):
        kh.get_kernel("test-org/toy-scale", version=1, lockfile=lockfile)
    ops = toy_kernel / "toy_scale/ops.py"
    ops.write_text(ops.read_text() + "\n# edited after locking\n")
    with pytest.raises(IntegrityError, match="changed since it was locked"):
        kh.get_kernel("test-org/toy-scale", lockfile=lockfile)


# -- only verified source runs ------------------------------------------------------------------------------


def _evil_pyc(ops: Path, sentinel: Path) -> Path:
    """A __pycache__ entry for ops.py stamped with its mtime and size: Python's own import would run it."""
    import importlib.util
    from importlib._bootstrap_external import _code_to_timestamp_pyc

    st = ops.stat()
    source = f"from pathlib import Path\nPath({str(sentinel)!r}).write_text('ran')\nFLAVOUR = 'evil'\n" \
             "def scale(x, factor=2.0):\n    return x * 42\n"
    pyc = Path(importlib.util.cache_from_source(str(ops)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(bytes(_code_to_timestamp_pyc(compile(source, str(ops), "exec"), st.st_mtime, st.st_size)))
    return pyc


def test_planted_bytecode_never_runs(toy_kernel, tmp_path):
    import subprocess

    sentinel = tmp_path / "PWNED"
    package = toy_kernel / "toy_scale"
    _evil_pyc(package / "ops.py", sentinel)
    (package / "__init__.pyc").write_bytes(b"\0" * 16)  # sourceless bytecode beside the package's source
    control = subprocess.run([sys.executable, "-B", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                              "import toy_scale; print(toy_scale.scale(1))", str(toy_kernel)],
                             capture_output=True, text=True, timeout=60)
    assert control.stdout.strip() == "42" and sentinel.exists(), control.stderr  # the plant is live for Python
    sentinel.unlink()
    mod = kh.get_local_kernel(toy_kernel, backend="cpu")
    assert float(mod.scale(np.ones(1), 2.0)[0]) == 2.0 and mod.FLAVOUR == "numpy"
    assert not sentinel.exists()
    ops = sys.modules[f"{mod.__name__}.ops"]
    assert ops.__spec__.cached is None and not hasattr(ops, "__cached__") and ops.__file__.endswith("ops.py")
    import inspect

    assert "np.float32(factor)" in inspect.getsource(ops.scale)  # tracebacks and inspect see the verified text


def test_files_outside_the_digests_never_import(toy_kernel):
    import importlib

    mod = kh.get_local_kernel(toy_kernel, backend="cpu")
    (toy_kernel / "toy_scale" / "late.py").write_text("raise SystemExit('must not run')\n")
    with pytest.raises(ModuleNotFoundError, match="among the verified files"):
        importlib.import_module(f"{mod.__name__}.late")
    validation = toy_kernel / "toy_scale" / "validation.py"
    verified = validation.read_text()
    validation.write_text(verified + "\nraise SystemExit('changed after loading')\n")
    lazy = importlib.import_module(f"{mod.__name__}.validation")  # a lazy import runs the bytes verified at load
    assert lazy.__loader__.get_source(lazy.__name__) == verified and callable(lazy.cases)


@pytest.mark.parametrize("raiser", ["raise SystemExit(3)", "import sys; sys.exit('bye')",
                                    "class Boom(BaseException): pass\nraise Boom('base')", "raise GeneratorExit"])
def test_any_base_exception_at_import_is_a_kernel_import_error(toy_kernel, raiser):
    (toy_kernel / "toy_scale/ops.py").write_text(raiser + "\n")
    before = set(sys.modules)
    with pytest.raises(KernelImportError, match="import failed") as exc:
        kh.get_local_kernel(toy_kernel, backend="cpu")
    assert "\n" not in str(exc.value)
    assert {m for m in set(sys.modules) - before if m.startswith("_kernel_hub_")} == set()


def test_keyboard_interrupt_at_import_still_interrupts(toy_kernel):
    (toy_kernel / "toy_scale/ops.py").write_text("raise KeyboardInterrupt\n")
    before = set(sys.modules)
    with pytest.raises(KeyboardInterrupt):
        kh.get_local_kernel(toy_kernel, backend="cpu")
    assert {m for m in set(sys.modules) - before if m.startswith("_kernel_hub_")} == set()


# -- structure ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["api", "load.lock", "verify.validation", "load.planning", "sources.hub.source",
                                    "cli"])
def test_each_module_imports_alone_in_a_fresh_interpreter(module):
    import subprocess

    out = subprocess.run([sys.executable, "-c", f"import kernel_hub.{module}"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
