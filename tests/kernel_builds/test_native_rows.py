"""The ragged dot's native rows kernel (native_rows.py): numbers against float64 on fresh random inputs at every tail
(rows past a block of four, weight rows short of a group, K not a multiple of the vector width), NaN kept where it
belongs, one grouped call equal to per-group calls bit for bit, and the build's trust rules: compiled only from the
package's own verified C files in a private folder that is gone before the first call; no compiler, a failed compile,
a failed self-test or KERNEL_HUB_CPU_NATIVE=0 each leave the kernel off with the reason, and the packed and unpacked
paths then take oneDNN / torch.mm together."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")



@pytest.fixture(scope="module")
def native(rd):
    module = sys.modules[rd.PackedExperts.__module__].native_rows
    for dtype in (torch.float32, torch.bfloat16):
        ok, why = module.available(dtype)
        if not ok:
            pytest.skip(f"the native rows kernel is not available here: {why}")
    return module


@pytest.fixture
def fresh(native, monkeypatch, tmp_path):
    """The native module with its build and availability caches cleared, compiling under tmp_path; both caches are
    cleared again afterwards so later tests rebuild with the real settings."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    native._library.cache_clear()
    native.available.cache_clear()
    yield native
    native._library.cache_clear()
    native.available.cache_clear()


@pytest.fixture(params=["chosen", "avx2"])
def build(request, native, monkeypatch):
    """The native module on the build this CPU chooses, then forced onto its AVX2 build, which every CPU running the
    AVX512 one also runs: both builds' numbers are checked wherever AVX512 is present."""
    if request.param == "avx2":
        if not all(f in native.cpu_flags() for f in native.AVX2_FLAGS):
            pytest.skip("this CPU lacks AVX2")
        monkeypatch.setattr(native, "isa", lambda dtype: native.Isa("AVX2", "_avx2", native.AVX2_FLAGS))
    native.available.cache_clear()
    yield native
    native.available.cache_clear()


def test_choose_isa_takes_avx512_only_with_every_flag_and_says_what_is_missing(native):
    needs = native.CPU_FLAGS[torch.bfloat16]
    full = frozenset({*needs, "avx2", "fma"})
    build, why = native.choose_isa(needs, full)
    assert build.suffix == "" and build.flags == needs and why.startswith("AVX512")
    build, why = native.choose_isa(needs, full - {"avx512_bf16"})
    assert build.suffix == "_avx2" and build.flags == native.AVX2_FLAGS and "avx512_bf16" in why
    assert "avx512f" not in why  # only what is missing is named
    build, _ = native.choose_isa(needs, frozenset())
    assert build.name == "AVX2"  # the gate then names what this CPU lacks of it:
    ok, why = native.gate(torch.float32, known={torch.float32: "x"}, flags=("avx2", "no_such_flag"), kernel="k",
                          for_cpu="native k", library=lambda: (None, "unused"), self_test=lambda d: "", passed="ok")
    assert not ok and why == "this CPU lacks no_such_flag for the native k"


def reference(x: torch.Tensor, w: torch.Tensor) -> np.ndarray:
    return x.double().numpy() @ w.double().numpy().T


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_rows_kernel_matches_float64_at_every_tail(build, dtype):
    native = build
    g = torch.Generator().manual_seed(21)
    bound = 1e-2 if dtype == torch.bfloat16 else 1e-5
    for rows in (1, 2, 3, 4, 5, 7, 8, 9, 16):
        for n, k in ((1, 1), (3, 15), (5, 17), (67, 2051), (768, 2048)):
            x = torch.randn(rows, k, generator=g).to(dtype)
            w = torch.randn(n, k, generator=g).to(dtype)
            assert native.fits(x, w)
            got = native.linear(x, w)
            assert got.dtype == dtype and got.shape == (rows, n) and not torch.isnan(got).any()
            ref = reference(x, w)
            err = np.abs(got.double().numpy() - ref).max() / max(np.abs(ref).max(), 1e-30)
            assert err <= bound, (rows, n, k, err)


def test_nan_stays_in_its_row_and_inf_in_its_column(build):
    native = build
    x = torch.randn(6, 40).to(torch.bfloat16)
    w = torch.randn(9, 40).to(torch.bfloat16)
    x[4, 7] = float("nan")
    w[2, 0] = float("inf")
    x[:, 0] = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0]).to(torch.bfloat16)
    got = native.linear(x, w)
    assert got[4].isnan().all()
    others = torch.tensor([0, 1, 2, 3, 5])
    assert not got[others].isnan().any()
    assert torch.equal(got[others, 2].float(), torch.sign(x[others, 0].float()) * float("inf"))


def test_fits_refuses_what_the_kernel_does_not_take(native):
    w = torch.randn(8, 32)
    assert native.fits(torch.randn(native.MAX_ROWS, 32), w)
    assert not native.fits(torch.randn(native.MAX_ROWS + 1, 32), w)  # prefill sizes: the blocked kernels
    assert not native.fits(torch.randn(0, 32), w)
    assert not native.fits(torch.randn(32, 4).t(), w)  # rows not contiguous
    assert not native.fits(torch.randn(4, 32), torch.randn(32, 8).t())  # a transposed weight
    assert not native.fits(torch.randn(4, 32).to(torch.bfloat16), w)  # mixed dtypes
    assert not native.fits(torch.randn(4, 32).half(), w.half())


def test_one_grouped_call_equals_per_group_calls_bit_for_bit(rd, build):
    """What the packed path runs (all experts in one call per worker) and what one group at a time would run agree in
    every bit, and both equal the public ragged dot (the unpacked grouped loop)."""
    native = build
    g = torch.Generator().manual_seed(5)
    for dtype in (torch.bfloat16, torch.float32):
        stack = torch.randn(6, 40, 72, generator=g).to(dtype)  # [G, N, K]
        sizes = [3, 0, 16, 1, 7, 2]  # an empty group, one at the row limit
        x = torch.randn(sum(sizes), 72, generator=g).to(dtype)
        out = torch.full((x.shape[0], 40), float("nan")).to(dtype)
        groups, start = [], 0
        for e, size in enumerate(sizes):
            if size:
                groups.append((e, start, start + size))
            start += size
        counter = torch.zeros(1, dtype=torch.int32)
        native.grouped(x, stack, out, native.grouped_items(groups), counter)
        assert int(counter) >= len(groups)
        one_by_one = torch.cat([native.linear(x[s:e], stack[grp]) for grp, s, e in groups])
        assert torch.equal(out, one_by_one)
        with torch.no_grad():
            assert torch.equal(out, rd.ragged_dot(x, stack.transpose(1, 2), torch.tensor(sizes)))


def test_build_uses_only_the_packages_c_files_in_a_private_folder_it_removes(fresh, monkeypatch, tmp_path):
    """The compiler gets the package's own native_rows.c (the last argument) with native_loops.h beside it, byte for
    byte as the package holds them, in a 0700 folder under the temp dir that is gone afterwards."""
    seen = []
    real = subprocess.run

    def spy(args, **kwargs):
        source = Path(args[-1])
        files = {p.name: p.read_bytes() for p in source.parent.iterdir()}
        seen.append((source, files, oct(source.parent.stat().st_mode & 0o777)))
        return real(args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    ok, why = fresh.available(torch.float32)
    assert ok, why
    [(source, files, mode)] = seen
    package = Path(fresh.__file__).parent
    assert source.name == "native_rows.c" and source.parent.parent == tmp_path and mode == "0o700"
    assert files == {name: (package / name).read_bytes() for name in ("native_rows.c", "native_loops.h")}
    assert not source.parent.exists() and list(tmp_path.iterdir()) == []  # nothing left behind


def test_the_build_ignores_the_compilers_environment(native, monkeypatch, tmp_path):
    """CPATH with a planted stdint.h that adds a constructor, and DEPENDENCIES_OUTPUT / SUNPRO_DEPENDENCIES naming
    files outside the private folder: the build reads none of them (it runs with build_env only)."""
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "constructor-ran"
    (planted / "stdint.h").write_text(
        "#include_next <stdint.h>\n"
        "#include <stdio.h>\n"
        f'__attribute__((constructor)) static void planted(void) {{ FILE *f = fopen("{marker}", "w");'
        " if (f) fclose(f); }\n")
    for var in ("CPATH", "C_INCLUDE_PATH"):
        monkeypatch.setenv(var, str(planted))
    monkeypatch.setenv("DEPENDENCIES_OUTPUT", str(tmp_path / "deps.d"))
    monkeypatch.setenv("SUNPRO_DEPENDENCIES", str(tmp_path / "sunpro.d"))
    monkeypatch.setenv("GCC_EXEC_PREFIX", str(tmp_path / "no-such-prefix") + "/")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "outside-tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "private"))
    (tmp_path / "private").mkdir()
    lib, why = native.compile_c(native.read_sources(native.C_FILES))
    assert lib is not None, why
    assert not marker.exists()  # the planted header's constructor is not in the library
    assert sorted(p.name for p in tmp_path.iterdir()) == ["planted", "private"]  # nothing written outside
    assert list((tmp_path / "private").iterdir()) == []  # and the private folder is gone
    env = native.build_env(str(tmp_path / "private" / "x"))
    assert set(env) == {"PATH", "TMPDIR", "LC_ALL"} and env["TMPDIR"] == str(tmp_path / "private" / "x")


@pytest.mark.parametrize("case", ["no_compiler", "compile_error", "self_test", "disabled"])
def test_when_the_kernel_is_off_it_says_why_and_both_paths_agree(rd, fresh, monkeypatch, tmp_path, case):
    if case == "no_compiler":
        monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
        words = "no C compiler"
    elif case == "compile_error":
        broken = tmp_path / "broken-cc"
        broken.write_text("#!/bin/sh\necho 'rows.c:1: error: simulated' >&2\nexit 1\n")
        broken.chmod(0o755)
        monkeypatch.setenv("CC", str(broken))
        words = "could not compile the native kernel: rows.c:1: error: simulated"
    elif case == "self_test":
        monkeypatch.setattr(fresh, "_run", lambda x, w, out=None: torch.zeros((x.shape[0], w.shape[0]), dtype=x.dtype))
        words = "self-test missed float64"
    else:
        monkeypatch.setenv(fresh.ENV, "0")
        words = f"{fresh.ENV}=0"
    ok, why = fresh.available(torch.float32)
    assert not ok and words in why
    assert not fresh.fits(torch.randn(4, 64), torch.randn(8, 64))
    weight = torch.randn(3, 64, 64)
    packed = rd.pack_experts(weight.clone(), transposed=False)
    assert not packed.native and packed.how.startswith("oneDNN")
    x = torch.randn(5, 64)
    with torch.no_grad():
        unpacked = rd.ragged_dot(x, weight.transpose(1, 2), torch.tensor([0, 5, 0]))
    assert torch.equal(packed.linear(1, x), unpacked)
    assert [p for p in tmp_path.iterdir() if p.name.startswith("kernel-hub-native-")] == []


def test_bf16_single_rows_never_reach_onednn_where_it_has_no_bf16(rd, fresh, monkeypatch):
    """oneDNN builds no bfloat16 linear on CPUs without AVX512 (it raises "could not create a primitive descriptor",
    which once made kernelize keep every bf16 MoE layer on such CPUs); with the native kernel off, one-row bfloat16
    groups there take torch.mm: within bf16 tolerance of float64 on this CPU as it is, and with oneDNN's bfloat16
    declared missing."""
    grouped = sys.modules[rd.PackedExperts.__module__.rsplit(".", 1)[0] + ".grouped"]
    monkeypatch.setenv(fresh.ENV, "0")
    g = torch.Generator().manual_seed(8)
    x = torch.randn(4, 96, generator=g).to(torch.bfloat16)
    w = torch.randn(3, 96, 40, generator=g).to(torch.bfloat16)  # [G, K, N]
    sizes = [1, 0, 3]
    x64, w64 = x.double().numpy(), w.double().numpy()
    ref = np.concatenate([x64[:1] @ w64[0], x64[1:] @ w64[2]])
    for declared_missing in (False, True):
        if declared_missing:
            monkeypatch.setattr(grouped, "onednn_bf16", lambda: False)
            assert not grouped.linear_for_group(x[:1], w[0])
        with torch.no_grad():
            out = rd.ragged_dot(x, w, torch.tensor(sizes))
        assert out.dtype == torch.bfloat16 and bool(out.isfinite().all())
        assert np.abs(out.double().numpy() - ref).max() / np.abs(ref).max() <= 1e-2
