"""A native x @ w^T for a few rows against a plain [N, K] weight on x86-64 CPUs (decode-sized experts).

Why: at decode a MoE layer's time is reading its active experts' weights once. oneDNN's blocked kernels, even on
prepacked weights, streamed them at 1.4-1.6x the memory floor on a 2-core Zen 4 VM with both cores busy; this loop
reads the weight rows in order, four at a time, with a software prefetch two groups ahead, and ran the same Qwen3 MoE
decode layer at 1.23-1.32x (bench/moe_decode.py). It reads the weight where it is, in its own layout: nothing is
reordered, so a model's weights stay exactly as loaded.

Builds: AVX512 (with AVX512-BF16 for bfloat16) where the CPU has it, else AVX2 + FMA (choose_isa): the same loop over
weight rows with 8-lane vectors and blocks of 2 rows of x (AVX2 has 16 vector registers), bfloat16 split into its
even and odd halves (a shift and a mask make each a float32, no conversion instruction).

Numbers: float32 accumulation (bfloat16 pairs by VDPBF16PS, float32 by FMA; on AVX2 both by FMA), each output's 16
(AVX2: 8) lanes summed in a fixed tree, the K tail past the vectors in scalar float32, then rounded to the input dtype
(round to nearest even, NaN kept). The torch-native grouped loop (grouped.py)
routes every product of at most MAX_ROWS rows against a plain weight here, packed or not, so both agree bit for bit.

Trust: the C source is native_loops.h and native_rows.c beside this module, read through this module's own loader
(read_sources): kernel-hub's verified loader checks each file's bytes against the build's digests as it hands them
over, so the compiler sees exactly the verified bytes, copied into a private temporary folder, compiled there by the
system C compiler, loaded, and the folder removed before any call. Nothing is cached on disk and no file outside
that folder is written. Where there is no compiler, no AVX2, another OS, an unreadable C file or the self-test
against float64 fails, `available` says why and the caller keeps oneDNN / torch.mm.

Imports torch only (the torch-cpu build runs where jax is absent); never imports kernel_hub.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

#: Products of at most this many rows run here (decode: a few rows per expert); more rows take the blocked kernels.
MAX_ROWS = 16
#: Set to "0" to keep every product on oneDNN / torch.mm.
ENV = "KERNEL_HUB_CPU_NATIVE"
#: What each dtype needs from the CPU (/proc/cpuinfo flags).
CPU_FLAGS = {torch.float32: ("avx512f", "fma"), torch.bfloat16: ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")}
#: What the AVX2 build of every kernel needs (x86-64 CPUs without AVX512: most laptops, Zen 2/3, older Xeons).
AVX2_FLAGS = ("avx2", "fma")

#: The C files of this kernel's build, beside this module in the package (package data, in the build's digests):
#: the loops both native kernels share (native_quant.py's build includes them too), then the kernel.
C_FILES = ("native_loops.h", "native_rows.c")
#: Compiler flags the kernel's C needs beyond compile_c's own (none: its functions carry their target attributes).
C_FLAGS: tuple[str, ...] = ()

_SYMBOLS = {torch.bfloat16: "kh_rows_bf16", torch.float32: "kh_rows_f32"}
_GROUPED = {torch.bfloat16: "kh_grouped_bf16", torch.float32: "kh_grouped_f32"}
#: Each kernel's builds, fastest first: (name, symbol suffix). Every symbol exists in both builds.
BUILDS = (("AVX512", ""), ("AVX2", "_avx2"))


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags (empty where there is no /proc/cpuinfo)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


class Isa(NamedTuple):
    """One build of a native kernel: its name, its symbols' suffix, the CPU flags it needs."""

    name: str
    suffix: str
    flags: tuple[str, ...]


def choose_isa(avx512_flags: tuple[str, ...], flags: frozenset[str]) -> tuple[Isa, str]:
    """The fastest build a CPU with `flags` runs (AVX512 when it has every one of `avx512_flags`, else AVX2) and why;
    AVX2 is returned even when missing, so the gate names what the CPU lacks."""
    avx512 = Isa("AVX512", "", avx512_flags)
    if all(f in flags for f in avx512_flags):
        return avx512, "AVX512 build: the CPU has " + ", ".join(avx512_flags)
    lacking = ", ".join(f for f in avx512_flags if f not in flags)
    return Isa("AVX2", "_avx2", AVX2_FLAGS), f"AVX2 build: the CPU lacks {lacking} for the AVX512 one"


def compiler() -> str | None:
    """The C compiler: $CC, else cc, gcc or clang on PATH."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return next((path for name in ("cc", "gcc", "clang") if (path := shutil.which(name))), None)


def build_env(folder: str) -> dict[str, str]:
    """The compiler's whole environment: PATH (to find the compiler's own assembler and linker), TMPDIR inside
    the private `folder`, and the C locale. Nothing else reaches it: CPATH, C_INCLUDE_PATH and LIBRARY_PATH (extra
    headers and libraries), DEPENDENCIES_OUTPUT and SUNPRO_DEPENDENCIES (files written elsewhere), GCC_EXEC_PREFIX
    and COMPILER_PATH (other compiler programs), CCACHE_* and LD_PRELOAD are all left out."""
    return {"PATH": os.environ.get("PATH") or os.defpath, "TMPDIR": folder, "LC_ALL": "C"}


def read_sources(names: tuple[str, ...]) -> dict[str, bytes]:
    """The named C files beside this module, read through this module's loader (importlib's get_data): kernel-hub's
    verified loader hands over only a file of the build's digests and checks its bytes as it reads them, so what is
    compiled is what was verified; a plain import (the kernel tests) reads the files as they are. OSError when a
    file cannot be read."""
    loader = __spec__.loader if __spec__ is not None else None
    get_data = getattr(loader, "get_data", None)
    if get_data is None:
        raise OSError(f"{type(loader).__name__} cannot read the package's data files")
    folder = os.path.dirname(os.path.abspath(__file__))
    return {name: get_data(os.path.join(folder, name)) for name in names}


def compile_c(sources: str | dict[str, bytes], flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """Compile C `sources` (file name -> bytes, the .c files compiled together and the headers beside them; or one
    source text) in a private folder, with the minimal environment of build_env and the folder as its working
    directory, load it, remove the folder; (library, "") or (None, why)."""
    files = {"rows.c": sources.encode()} if isinstance(sources, str) else sources
    if any(os.path.basename(name) != name or name.startswith(".") for name in files):
        raise ValueError(f"C source names must be plain file names: {sorted(files)}")
    cc = compiler()
    if cc is None:
        return None, "no C compiler ($CC, cc, gcc or clang) to build the native kernel"
    folder = tempfile.mkdtemp(prefix="kernel-hub-native-")
    try:
        for name, data in files.items():
            Path(folder, name).write_bytes(data)
        lib = Path(folder, "rows.so")
        units = [str(Path(folder, name)) for name in files if name.endswith(".c")]
        done = subprocess.run([cc, "-O3", *flags, "-shared", "-fPIC", "-o", str(lib), *units], capture_output=True,
                              text=True, timeout=120, check=False, env=build_env(folder), cwd=folder)
        if done.returncode != 0:
            first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:200])
            return None, f"{Path(cc).name} could not compile the native kernel: {first}"
        return ctypes.CDLL(str(lib)), ""
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"compiling the native kernel failed: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def load_native(files: tuple[str, ...], signatures: dict[str, list[type]], what: str,
                flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """Build the C `files` beside this module (read_sources, then compile_c with `flags`) where the native kernels
    run (x86-64 Linux) and declare each symbol's argument types (all return void); (library, "") or (None, why).
    `what` names the kernel in the reason."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"{what} is built for x86-64 Linux, not {sys.platform} {platform.machine()}"
    try:
        sources = read_sources(files)
    except OSError as exc:
        return None, f"cannot read the C source of {what}: {exc}"
    lib, why = compile_c(sources, flags)
    if lib is None:
        return None, why
    for symbol, argtypes in signatures.items():
        fn = getattr(lib, symbol)
        fn.argtypes = argtypes
        fn.restype = None
    return lib, ""


def gate(dtype: torch.dtype, *, known: object, flags: tuple[str, ...], kernel: str, for_cpu: str,
         library: Callable[[], tuple[ctypes.CDLL | None, str]], self_test: Callable[[torch.dtype], str],
         passed: str) -> tuple[bool, str]:
    """(can `dtype` run on a native kernel here, why), in order: the ENV switch, a kernel for the dtype (`known`),
    the CPU `flags`, the build (`library`), then the kernel's own `self_test`. `kernel` ("no {kernel} for int8"),
    `for_cpu` ("this CPU lacks ... for the {for_cpu}") and `passed` word the reasons."""
    name = str(dtype).replace("torch.", "")
    if os.environ.get(ENV, "1") == "0":
        return False, f"native kernel off ({ENV}=0)"
    if dtype not in known:  # type: ignore[operator]
        return False, f"no {kernel} for {name}"
    missing = [f for f in flags if f not in cpu_flags()]
    if missing:
        return False, f"this CPU lacks {', '.join(missing)} for the {for_cpu}"
    lib, why = library()
    if lib is None:
        return False, why
    problem = self_test(dtype)
    if problem:
        return False, problem
    return True, passed


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str]:
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    return load_native(C_FILES, {**{symbol + suffix: [ptr, ptr, ptr, i32, i32, i32]
                                    for symbol in _SYMBOLS.values() for _, suffix in BUILDS},
                                 **{symbol + suffix: [ptr, ptr, ptr, ptr, i32, i32, i32, ptr]
                                    for symbol in _GROUPED.values() for _, suffix in BUILDS}},
                       "the native kernel", C_FLAGS)


@functools.cache
def isa(dtype: torch.dtype) -> Isa:
    """The build `dtype` products run on here (choose_isa on this CPU's flags)."""
    return choose_isa(CPU_FLAGS.get(dtype, ()), cpu_flags())[0]


def _self_test(dtype: torch.dtype) -> str:
    """"" when the kernel matches float64 on shapes with every tail (rows past a block of 4, a weight row group
    short of 4, K not a multiple of the vector width) and keeps NaN; else what went wrong."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 45, generator=g).to(dtype)
    w = torch.randn(11, 45, generator=g).to(dtype)
    got = _run(x, w).double()
    ref = x.double() @ w.double().t()
    err = float((got - ref).abs().max() / ref.abs().max())
    bound = 1e-2 if dtype == torch.bfloat16 else 1e-5
    if not err <= bound:
        return f"the native kernel's self-test missed float64 by {err:.1e} (bound {bound:.0e})"
    x[2, 3] = float("nan")
    poisoned = _run(x, w)
    if not (bool(poisoned[2].isnan().all()) and not bool(poisoned[[0, 1, 3, 4, 5, 6]].isnan().any())):
        return "the native kernel's self-test lost or spread a NaN"
    return ""


@functools.cache
def available(dtype: torch.dtype) -> tuple[bool, str]:
    """(can `dtype` products run natively here, why). Builds and self-tests the kernel once per process."""
    name = str(dtype).replace("torch.", "")
    build = isa(dtype)
    return gate(dtype, known=_SYMBOLS, flags=build.flags, kernel="native kernel",
                for_cpu=f"native {name} kernel", library=_library, self_test=_self_test,
                passed=f"native {build.name} {name} rows kernel (self-test passed)")


def _run(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    lib, _ = _library()
    assert lib is not None
    if out is None:
        out = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype)
    fn = getattr(lib, _SYMBOLS[x.dtype] + isa(x.dtype).suffix)
    fn(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.shape[0], w.shape[0], w.shape[1])
    return out


def fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether x @ w^T runs natively: 2-D CPU tensors of one supported dtype, 1..MAX_ROWS rows, both contiguous,
    and the kernel available for that dtype. Cheap checks first: this runs once per expert per call."""
    return (0 < x.shape[0] <= MAX_ROWS and x.dtype == w.dtype and x.dim() == 2 and w.dim() == 2
            and x.shape[1] == w.shape[1] and w.shape[0] > 0 and x.device.type == "cpu" and w.device.type == "cpu"
            and x.is_contiguous() and w.is_contiguous() and x.dtype in _SYMBOLS and available(x.dtype)[0])


def linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w^T for x [M, K], w [N, K] (check `fits` first), into `out` (contiguous [M, N]) when given. Releases the
    GIL while it runs (ctypes)."""
    return _run(x, w, out)


def grouped_items(groups: list[tuple[int, int, int]]) -> torch.Tensor:
    """The [n, 3] int64 (expert, first row, rows) table `grouped` takes, from (expert, start, end) triples."""
    return torch.tensor([(g, start, end - start) for g, start, end in groups], dtype=torch.int64).reshape(-1, 3)


def grouped(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, items: torch.Tensor, next_item: torch.Tensor) -> None:
    """out[rows of item] = x[rows of item] @ w[expert]^T for every item not yet taken through `next_item` (an int32
    counter tensor shared by the threads that call this together). x [rows, K], w [E, N, K], out [rows, N], all
    contiguous, one dtype with `available`; every item at most MAX_ROWS rows. Releases the GIL while it runs."""
    lib, _ = _library()
    assert lib is not None
    fn = getattr(lib, _GROUPED[x.dtype] + isa(x.dtype).suffix)
    fn(x.data_ptr(), w.data_ptr(), out.data_ptr(), items.data_ptr(), items.shape[0], w.shape[1], w.shape[2],
       next_item.data_ptr())
