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

Trust: the C source is the SOURCE string of this module, which the client's verified loader imported from checked
bytes; it is compiled by the system C compiler into a private temporary folder, loaded, and the folder removed before
any call. Nothing is cached on disk and no file outside that folder is written. Where there is no compiler, no AVX2,
another OS or the self-test against float64 fails, `available` says why and the caller keeps oneDNN / torch.mm.

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

#: The C both native kernels share (native_quant.py's SOURCE starts with it too): the weight-row group and prefetch
#: distance, the loop over weight-row groups and blocks of x's rows, and the loop over a grouped call's items.
C_LOOPS = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stddef.h>

/* Four weight rows at a time (R), all of x's rows against them in blocks of four before the next group, so each
   weight byte is read from memory once; the rows two groups ahead are prefetched into L2. */
#define R 4
#define AHEAD 2

/* The weight rows in groups of R, then one at a time; against each, x's rows in blocks of up to 4 (mm of them).
   SETUP runs first in each block (more per-row pointers), then BLOCKS(RR) computes out[m0 .. m0 + mm) x
   [n0 .. n0 + RR) from wr (weight row n0), x (row m0 of x0) and out (row m0 of out0). The enclosing function has
   x0, w, out0 (element types XT, WT, OT) and M, N, K. */
#define FOR_ROW_BLOCKS(WT, XT, OT, SETUP, BLOCKS) FOR_ROW_BLOCKS_M(WT, XT, OT, SETUP, BLOCKS, 4)
/* The same with blocks of up to MB rows of x (AVX2 has 16 vector registers: its blocks take 2 rows). */
#define FOR_ROW_BLOCKS_M(WT, XT, OT, SETUP, BLOCKS, MB)                                                      \
    int n0 = 0;                                                                                               \
    for (; n0 + R <= N; n0 += R) {                                                                            \
        const WT *wr = w + (size_t)n0 * K;                                                                    \
        for (int m0 = 0; m0 < M; m0 += MB) {                                                                  \
            int mm = M - m0 < MB ? M - m0 : MB;                                                               \
            const XT *x = x0 + (size_t)m0 * K;                                                                \
            OT *out = out0 + (size_t)m0 * N;                                                                  \
            SETUP                                                                                             \
            BLOCKS(R)                                                                                         \
        }                                                                                                     \
    }                                                                                                         \
    for (; n0 < N; n0++) {                                                                                    \
        const WT *wr = w + (size_t)n0 * K;                                                                    \
        for (int m0 = 0; m0 < M; m0 += MB) {                                                                  \
            int mm = M - m0 < MB ? M - m0 : MB;                                                               \
            const XT *x = x0 + (size_t)m0 * K;                                                                \
            OT *out = out0 + (size_t)m0 * N;                                                                  \
            SETUP                                                                                             \
            BLOCKS(1)                                                                                         \
        }                                                                                                     \
    }

/* AVX2: a fixed-order sum of 8 float lanes (the same tree for every output, so results do not depend on the call). */
__attribute__((target("avx2,fma"))) static inline float kh_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* bfloat16 bits -> float32 (exact). */
static inline float kh_bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

/* float32 -> bfloat16 bits, rounded to nearest even (as torch's .to(torch.bfloat16)); NaN stays NaN. */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Many experts in one call: items[i] = (expert, first row, rows). Every thread that calls with the same `next`
   takes the next item (dynamic scheduling), so two workers share one layer without a return to Python per
   expert; the statement given runs one item `it`. The enclosing function has items, n and next. */
#define FOR_ITEMS(...)                                                                                        \
    for (;;) {                                                                                                \
        int i = __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);                                                \
        if (i >= n) break;                                                                                    \
        const int64_t *it = items + 3 * (size_t)i;                                                            \
        __VA_ARGS__;                                                                                          \
    }
"""

SOURCE = C_LOOPS + r"""
#include <string.h>

/* out[m, n] = sum_k x[m, k] * w[n, k] for x [M, K], w [N, K] (rows contiguous), out [M, N]; float32 accumulation. */


#define BF16_BLOCK(MM, RR)                                                                                    \
    {                                                                                                         \
        __m512 acc[MM][RR];                                                                                   \
        for (int m = 0; m < MM; m++)                                                                          \
            for (int r = 0; r < RR; r++) acc[m][r] = _mm512_setzero_ps();                                     \
        int k = 0;                                                                                            \
        for (; k + 32 <= K; k += 32) {                                                                        \
            __m512bh wv[RR];                                                                                  \
            for (int r = 0; r < RR; r++) {                                                                    \
                _mm_prefetch((const char *)(wr + (size_t)(r + AHEAD * R) * K + k), _MM_HINT_T1);              \
                wv[r] = (__m512bh)_mm512_loadu_si512(wr + (size_t)r * K + k);                                 \
            }                                                                                                 \
            for (int m = 0; m < MM; m++) {                                                                    \
                __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (size_t)m * K + k);                            \
                for (int r = 0; r < RR; r++) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);              \
            }                                                                                                 \
        }                                                                                                     \
        if (k < K) {                                                                                          \
            __mmask32 tail = (__mmask32)((1ull << (K - k)) - 1);                                              \
            __m512bh wv[RR];                                                                                  \
            for (int r = 0; r < RR; r++) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(tail, wr + (size_t)r * K + k); \
            for (int m = 0; m < MM; m++) {                                                                    \
                __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(tail, x + (size_t)m * K + k);                \
                for (int r = 0; r < RR; r++) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);              \
            }                                                                                                 \
        }                                                                                                     \
        for (int m = 0; m < MM; m++)                                                                          \
            for (int r = 0; r < RR; r++) out[(size_t)m * N + n0 + r] = to_bf16(_mm512_reduce_add_ps(acc[m][r])); \
    }

#define F32_BLOCK(MM, RR)                                                                                     \
    {                                                                                                         \
        __m512 acc[MM][RR];                                                                                   \
        for (int m = 0; m < MM; m++)                                                                          \
            for (int r = 0; r < RR; r++) acc[m][r] = _mm512_setzero_ps();                                     \
        int k = 0;                                                                                            \
        for (; k + 16 <= K; k += 16) {                                                                        \
            __m512 wv[RR];                                                                                    \
            for (int r = 0; r < RR; r++) {                                                                    \
                _mm_prefetch((const char *)(wr + (size_t)(r + AHEAD * R) * K + k), _MM_HINT_T1);              \
                wv[r] = _mm512_loadu_ps(wr + (size_t)r * K + k);                                              \
            }                                                                                                 \
            for (int m = 0; m < MM; m++) {                                                                    \
                __m512 xv = _mm512_loadu_ps(x + (size_t)m * K + k);                                           \
                for (int r = 0; r < RR; r++) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);               \
            }                                                                                                 \
        }                                                                                                     \
        if (k < K) {                                                                                          \
            __mmask16 tail = (__mmask16)((1u << (K - k)) - 1);                                                \
            __m512 wv[RR];                                                                                    \
            for (int r = 0; r < RR; r++) wv[r] = _mm512_maskz_loadu_ps(tail, wr + (size_t)r * K + k);         \
            for (int m = 0; m < MM; m++) {                                                                    \
                __m512 xv = _mm512_maskz_loadu_ps(tail, x + (size_t)m * K + k);                               \
                for (int r = 0; r < RR; r++) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);               \
            }                                                                                                 \
        }                                                                                                     \
        for (int m = 0; m < MM; m++)                                                                          \
            for (int r = 0; r < RR; r++) out[(size_t)m * N + n0 + r] = _mm512_reduce_add_ps(acc[m][r]);       \
    }

#define ROWS(BLOCK, RR)                                                                                       \
    switch (mm) {                                                                                             \
    case 1: BLOCK(1, RR) break;                                                                               \
    case 2: BLOCK(2, RR) break;                                                                               \
    case 3: BLOCK(3, RR) break;                                                                               \
    default: BLOCK(4, RR)                                                                                     \
    }

#define BF16_ROWS(RR) ROWS(BF16_BLOCK, RR)
#define F32_ROWS(RR) ROWS(F32_BLOCK, RR)

#define GEMV(NAME, T, BLOCKS, TARGET)                                                                         \
    __attribute__((target(TARGET))) void NAME(const T *x0, const T *w, T *out0, int M, int N, int K) {       \
        FOR_ROW_BLOCKS(T, T, T, , BLOCKS)                                                                     \
    }

GEMV(kh_rows_bf16, uint16_t, BF16_ROWS, "avx512f,avx512bw,avx512vl,avx512bf16,fma")
GEMV(kh_rows_f32, float, F32_ROWS, "avx512f,fma")

/* AVX2 + FMA (no AVX512): blocks of up to 2 rows of x against RR weight rows, 8 float lanes. bfloat16 pairs are split
   into their even and odd halves (a shift and a mask make each a float32), so each 32-byte load feeds two FMAs with no
   conversion instruction; every product is exact in float32 and the sums run in float32, the K tail (under 16 / 8)
   in scalar float32 after the vector part. */
#define T2 __attribute__((target("avx2,fma")))
#define BF16_EVEN(v) _mm256_castsi256_ps(_mm256_slli_epi32((v), 16))
#define BF16_ODD(v) _mm256_castsi256_ps(_mm256_and_si256((v), _mm256_set1_epi32((int)0xffff0000u)))

#define BF16_BLOCK2(MM, RR)                                                                                   \
    {                                                                                                         \
        __m256 acc[MM][RR];                                                                                   \
        for (int m = 0; m < MM; m++)                                                                          \
            for (int r = 0; r < RR; r++) acc[m][r] = _mm256_setzero_ps();                                     \
        int k = 0;                                                                                            \
        for (; k + 16 <= K; k += 16) {                                                                        \
            __m256 xe[MM], xo[MM];                                                                            \
            for (int m = 0; m < MM; m++) {                                                                    \
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x + (size_t)m * K + k));                    \
                xe[m] = BF16_EVEN(xv);                                                                        \
                xo[m] = BF16_ODD(xv);                                                                         \
            }                                                                                                 \
            for (int r = 0; r < RR; r++) {                                                                    \
                _mm_prefetch((const char *)(wr + (size_t)(r + AHEAD * R) * K + k), _MM_HINT_T1);              \
                __m256i wv = _mm256_loadu_si256((const __m256i *)(wr + (size_t)r * K + k));                   \
                __m256 we = BF16_EVEN(wv), wo = BF16_ODD(wv);                                                 \
                for (int m = 0; m < MM; m++)                                                                  \
                    acc[m][r] = _mm256_fmadd_ps(xo[m], wo, _mm256_fmadd_ps(xe[m], we, acc[m][r]));            \
            }                                                                                                 \
        }                                                                                                     \
        for (int m = 0; m < MM; m++)                                                                          \
            for (int r = 0; r < RR; r++) {                                                                    \
                float t = kh_hsum8(acc[m][r]);                                                                \
                for (int kk = k; kk < K; kk++)                                                                \
                    t += kh_bf16_f32(x[(size_t)m * K + kk]) * kh_bf16_f32(wr[(size_t)r * K + kk]);            \
                out[(size_t)m * N + n0 + r] = to_bf16(t);                                                     \
            }                                                                                                 \
    }

#define F32_BLOCK2(MM, RR)                                                                                    \
    {                                                                                                         \
        __m256 acc[MM][RR];                                                                                   \
        for (int m = 0; m < MM; m++)                                                                          \
            for (int r = 0; r < RR; r++) acc[m][r] = _mm256_setzero_ps();                                     \
        int k = 0;                                                                                            \
        for (; k + 8 <= K; k += 8) {                                                                          \
            __m256 xv[MM];                                                                                    \
            for (int m = 0; m < MM; m++) xv[m] = _mm256_loadu_ps(x + (size_t)m * K + k);                      \
            for (int r = 0; r < RR; r++) {                                                                    \
                _mm_prefetch((const char *)(wr + (size_t)(r + AHEAD * R) * K + k), _MM_HINT_T1);              \
                __m256 wv = _mm256_loadu_ps(wr + (size_t)r * K + k);                                          \
                for (int m = 0; m < MM; m++) acc[m][r] = _mm256_fmadd_ps(xv[m], wv, acc[m][r]);               \
            }                                                                                                 \
        }                                                                                                     \
        for (int m = 0; m < MM; m++)                                                                          \
            for (int r = 0; r < RR; r++) {                                                                    \
                float t = kh_hsum8(acc[m][r]);                                                                \
                for (int kk = k; kk < K; kk++) t += x[(size_t)m * K + kk] * wr[(size_t)r * K + kk];           \
                out[(size_t)m * N + n0 + r] = t;                                                              \
            }                                                                                                 \
    }

#define ROWS2(BLOCK, RR)                                                                                      \
    switch (mm) {                                                                                             \
    case 1: BLOCK(1, RR) break;                                                                               \
    default: BLOCK(2, RR)                                                                                     \
    }

#define BF16_ROWS2(RR) ROWS2(BF16_BLOCK2, RR)
#define F32_ROWS2(RR) ROWS2(F32_BLOCK2, RR)

T2 void kh_rows_bf16_avx2(const uint16_t *x0, const uint16_t *w, uint16_t *out0, int M, int N, int K) {
    FOR_ROW_BLOCKS_M(uint16_t, uint16_t, uint16_t, , BF16_ROWS2, 2)
}
T2 void kh_rows_f32_avx2(const float *x0, const float *w, float *out0, int M, int N, int K) {
    FOR_ROW_BLOCKS_M(float, float, float, , F32_ROWS2, 2)
}

/* Many experts in one call (FOR_ITEMS): rows of x and out are in expert order, w is a contiguous [E, N, K] stack.
   Each output is summed exactly as a single call would sum it. */
#define GROUPED(NAME, SINGLE, T, TARGET)                                                                      \
    __attribute__((target(TARGET))) void NAME(const T *x, const T *w, T *out, const int64_t *items, int n,   \
                                              int N, int K, int *next) {                                     \
        FOR_ITEMS(SINGLE(x + it[1] * K, w + it[0] * (int64_t)N * K, out + it[1] * N, (int)it[2], N, K))       \
    }

GROUPED(kh_grouped_bf16, kh_rows_bf16, uint16_t, "avx512f,avx512bw,avx512vl,avx512bf16,fma")
GROUPED(kh_grouped_f32, kh_rows_f32, float, "avx512f,fma")
GROUPED(kh_grouped_bf16_avx2, kh_rows_bf16_avx2, uint16_t, "avx2,fma")
GROUPED(kh_grouped_f32_avx2, kh_rows_f32_avx2, float, "avx2,fma")
"""

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


def compile_c(source: str, flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """Compile C `source` in a private folder, with the minimal environment of build_env and the folder as its
    working directory, load it, remove the folder; (library, "") or (None, why)."""
    cc = compiler()
    if cc is None:
        return None, "no C compiler ($CC, cc, gcc or clang) to build the native kernel"
    folder = tempfile.mkdtemp(prefix="kernel-hub-native-")
    try:
        src, lib = Path(folder, "rows.c"), Path(folder, "rows.so")
        src.write_text(source)
        done = subprocess.run([cc, "-O3", *flags, "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True,
                              text=True, timeout=120, check=False, env=build_env(folder), cwd=folder)
        if done.returncode != 0:
            first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:200])
            return None, f"{Path(cc).name} could not compile the native kernel: {first}"
        return ctypes.CDLL(str(lib)), ""
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"compiling the native kernel failed: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def load_native(source: str, signatures: dict[str, list[type]], what: str) -> tuple[ctypes.CDLL | None, str]:
    """Build C `source` (compile_c) where the native kernels run (x86-64 Linux) and declare each symbol's argument
    types (all return void); (library, "") or (None, why). `what` names the kernel in the reason."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"{what} is built for x86-64 Linux, not {sys.platform} {platform.machine()}"
    lib, why = compile_c(source)
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
    return load_native(SOURCE, {**{symbol + suffix: [ptr, ptr, ptr, i32, i32, i32]
                                   for symbol in _SYMBOLS.values() for _, suffix in BUILDS},
                                **{symbol + suffix: [ptr, ptr, ptr, ptr, i32, i32, i32, ptr]
                                   for symbol in _GROUPED.values() for _, suffix in BUILDS}},
                       "the native kernel")


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
