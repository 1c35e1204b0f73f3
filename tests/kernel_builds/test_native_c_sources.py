"""The ragged dot's native C sources as files of the kernel package: every .c file there is part of a kernel's build,
each compiles with the strict warning set below turned into errors, for the AVX512 and the AVX2 build (both live in
each file, one target attribute per function: compiled as the kernel builds them and under each ISA's baseline, so
the shared inline helpers are checked as each build inlines them), and the kernel reads them through the verified
loader, which hands over only digest-checked bytes of files inside the build."""

from __future__ import annotations

import importlib
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kernel_hub as kh
from kernel_hub.errors import IntegrityError
from kernel_hub.load.loader import verified_digests

torch = pytest.importorskip("torch")

#: Every warning group GCC has for C code of this kind, as errors (-Wconversion includes -Wsign-conversion in C).
WARNINGS = ("-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Wcast-qual", "-Wstrict-prototypes",
            "-Wmissing-prototypes", "-Wconversion", "-Wdouble-promotion", "-Wundef", "-Werror")
#: The kernel's own command (no -march: each function's target attribute picks its ISA), then each build's baseline.
BASELINES = {"as built": (), "AVX2 baseline": ("-march=x86-64-v3",), "AVX512 baseline": ("-march=x86-64-v4",)}
KERNELS = ("native_rows", "native_quant")


@pytest.fixture(scope="module")
def modules(rd):
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the native kernels are x86-64 Linux code")
    found = {name: importlib.import_module(f"{rd.__name__}.torch_cpu.{name}") for name in KERNELS}
    if found["native_rows"].compiler() is None:
        pytest.skip("no C compiler here")
    return found


def test_every_c_file_of_the_package_is_built_by_a_kernel(rd, modules):
    folder = Path(modules["native_rows"].__file__).parent
    on_disk = {p.name for p in folder.iterdir() if p.suffix in (".c", ".h")}
    built = {name for module in modules.values() for name in module.C_FILES}
    assert on_disk == built == {"native_loops.h", "native_rows.c", "native_quant.c"}
    digests = verified_digests(rd)
    assert digests is not None and {f"torch_cpu/{name}" for name in built} <= set(digests)  # in the release digests


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("which", KERNELS)
def test_the_c_sources_compile_without_a_warning(modules, which, baseline, tmp_path):
    module, rows = modules[which], modules["native_rows"]
    for name, data in rows.read_sources(module.C_FILES).items():  # the verified bytes, as the build reads them
        (tmp_path / name).write_bytes(data)
    units = [name for name in module.C_FILES if name.endswith(".c")]
    done = subprocess.run([rows.compiler(), "-O3", *module.C_FLAGS, *BASELINES[baseline], *WARNINGS, "-c", *units],
                          capture_output=True, text=True, timeout=300, env=rows.build_env(str(tmp_path)),
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stderr == ""


@pytest.mark.parametrize(("body", "flag"), [("unsigned char b = a; return b;", "conversion"),
                                          ("unsigned long c = a; return (int)c;", "sign-conversion")])
def test_the_warning_set_fails_a_warning(modules, tmp_path, body, flag):
    """The flags above do turn a warning into a failed compile (so a clean run above means clean code): a narrowing
    and an int -> size_t conversion, the kind the kernels' index arithmetic spells out."""
    rows = modules["native_rows"]
    (tmp_path / "w.c").write_text(f"int kh_w(int a);\nint kh_w(int a) {{ {body} }}\n")
    done = subprocess.run([rows.compiler(), "-O3", *WARNINGS, "-c", "w.c"], capture_output=True, text=True,
                          timeout=60, env=rows.build_env(str(tmp_path)), cwd=tmp_path)
    assert done.returncode != 0 and f"[-Werror={flag}]" in done.stderr


def test_the_verified_loader_hands_over_only_checked_files_of_the_build(toy_kernel, tmp_path):
    package = toy_kernel / "toy_scale"
    (package / "table.c").write_bytes(b"int kh_table;\n")
    mod = kh.get_local_kernel(toy_kernel, backend="cpu")
    loader = mod.__spec__.loader
    assert loader.get_data(str(package / "table.c")) == b"int kh_table;\n"
    assert float(mod.scale(np.ones(1), 2.0)[0]) == 2.0
    (package / "late.c").write_bytes(b"int late;\n")
    outside = tmp_path / "outside.c"
    outside.write_bytes(b"int outside;\n")
    for path in (package / "late.c", outside, package / ".." / "kernel.yaml", package / "sub" / ".." / ".." / "x"):
        with pytest.raises(FileNotFoundError, match="not among the build's verified files"):
            loader.get_data(str(path))
    (package / "table.c").write_bytes(b"int kh_table = 1;\n")
    with pytest.raises(IntegrityError, match="table.c changed after it was verified"):
        loader.get_data(str(package / "table.c"))
