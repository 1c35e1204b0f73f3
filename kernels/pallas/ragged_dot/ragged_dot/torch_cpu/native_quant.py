"""A native x @ dequant(w)^T for a few rows against quantized [N, K] weights on x86-64 CPUs (AVX512 or AVX2).

Why: at decode a MoE layer's time is reading its active experts' weights once; int8 and float8 weights are half the
bytes of bfloat16 only if they are read as bytes. This loop streams the quantized rows in order (four at a time,
prefetched two groups ahead, like native_rows.py), widens each byte to float32 in registers and multiplies it into
float32 accumulators; no dequantized copy of a weight is ever written.

Formats (quant_format.py; quantized_ragged_dot.py checks the scales before a call):
- int8, one float32 scale per output channel: out[m, n] = scale[n] * sum_k x[m, k] * w[n, k]. The integer weights
  are exact in float32, so the only rounding is float32 accumulation and the final product.
- float8_e4m3fn, one float32 scale per 128 x 128 block (transformers' fine-grained FP8 layout, here for a [N, K]
  weight: scale[k // 128 * sk + n // 128 * sn]): each output's sum is taken per 128-wide slice of K and multiplied by
  that block's scale. The e4m3fn bytes are decoded exactly (normals, subnormals, zeros of either sign, NaN).

x is float32 [M, K] (a bfloat16 lhs is widened first: exact); out is float32 [M, N]; the caller rounds to its dtype.

int8 weights against a bfloat16 lhs take a faster route where the CPU has AVX512-VNNI (`x16_rows`, `grouped_x16`):
each lhs row as int16 with one float scale (XBITS = 14 bits of magnitude, round to nearest: every element within
2^-15 of its row's max |x|), multiplied by VPDPWSSD into exact int32 sums (one instruction per 32 weights and row,
against two widenings and two FMAs per 32 on the float32 route). The lhs rounding is ~1e-4 of an output's size for
Gaussian-like rows, far under the bfloat16 result's own rounding (2^-9); float32 lhs never takes it, nor rows holding
NaN or Inf (those keep the float32 route, so NaN stays in its row). The rows are made in one native pass
(kh_x16_rows: the same float32 steps as the torch ops they replace, 0.1 ms instead of ~0.8 ms for a decode batch's
[512, 2048] on a worker), and where every product of a call takes the route it writes bfloat16 itself (each output
rounded once from its float32 value, as torch's .to() rounds), so no float32 output is made and converted.
AVX2 CPUs (no AVX512: native_rows.choose_isa) run AVX2 builds of all three: 8 float lanes, blocks of 2 rows of x,
bytes widened by VPMOVSXBD / VPMOVZXBD, the K tail of each slice in scalar float32; the int16-lhs route by VPMADDWD
(16 int16 pairs into 8 exact int32 sums) and an add, with the same XBITS, spans and float64 totals.
Trust and build as native_rows.py (the C source is native_loops.h and native_quant.c beside this module, read
through the verified loader, compiled into a private folder, removed before any call; a self-test against float64
gates it). Imports torch only; never imports kernel_hub.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from . import native_rows
from .quant_format import dequantize, quantize

#: Products of at most this many rows run here; more rows take quantized_ragged_dot.py's dequantize-and-matmul route.
MAX_ROWS = 16
#: Set to "0" to keep every quantized product on the dequantize-and-matmul route.
ENV = native_rows.ENV
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "fma")
#: Bits of magnitude of the int16 lhs rows of the VNNI route (I16_SPAN * 2^XBITS * 127 < 2^31 in the C source).
XBITS = 14

#: The C files of this kernel's build, beside this module in the package (package data, in the build's digests):
#: the loops it shares with native_rows.c, then the kernel.
C_FILES = ("native_loops.h", "native_quant.c")
#: XBITS reaches the C as a define, so the Python rows (x16_rows) and the C kernels use one number.
C_FLAGS = (f"-DXBITS={XBITS}",)

_ROWS = {torch.int8: "kh_q_rows_i8", torch.float8_e4m3fn: "kh_q_rows_f8"}
_GROUPED = {torch.int8: "kh_q_grouped_i8", torch.float8_e4m3fn: "kh_q_grouped_f8"}


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str]:
    ptr, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    rows = [ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32]
    grouped = [ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, i64, ptr]
    signatures: dict[str, list[type]] = {}
    for _, suffix in native_rows.BUILDS:
        signatures.update({symbol + suffix: rows for symbol in _ROWS.values()})
        signatures.update({symbol + suffix: grouped for symbol in _GROUPED.values()})
        for out in ("", "_bf16"):
            signatures["kh_q_rows_i8_x16" + suffix + out] = [ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32]
            signatures["kh_q_grouped_i8_x16" + suffix + out] = [ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32,
                                                                i64, ptr]
        signatures["kh_x16_rows" + suffix] = [ptr, ptr, ptr, ptr, i32, i32]
    lib, why = native_rows.load_native(C_FILES, signatures, "the native quantized kernel", C_FLAGS)
    if lib is not None:
        for _, suffix in native_rows.BUILDS:
            getattr(lib, "kh_x16_rows" + suffix).restype = i32  # the count of rows holding NaN or Inf
    return lib, why


@functools.cache
def _flags() -> frozenset[str]:
    return native_rows.cpu_flags()


@functools.cache
def isa() -> native_rows.Isa:
    """The build quantized products run on here: AVX512 (CPU_FLAGS) or AVX2 (native_rows.choose_isa)."""
    return native_rows.choose_isa(CPU_FLAGS, _flags())[0]


def x16_suffix(build: native_rows.Isa, flags: frozenset[str]) -> str | None:
    """The int16-lhs route's symbol suffix for `build` on a CPU with `flags`: the AVX512 build needs AVX512-VNNI
    (VPDPWSSD); the AVX2 build uses VPMADDWD, which every AVX2 CPU has; None where there is no such route."""
    if build.suffix == "":
        return "" if "avx512_vnni" in flags else None
    return build.suffix


def scale_strides(weight_dtype: torch.dtype, scale: torch.Tensor) -> tuple[int, int]:
    """(sk, sn) of one expert's contiguous scale for the C kernel: int8 [N] per channel -> (0, 1); float8 blocks
    given as [KB, NB] (the rhs orientation) -> (NB, 1)."""
    if weight_dtype == torch.int8:
        return 0, 1
    return scale.shape[-1], 1


def _self_test(dtype: torch.dtype) -> str:
    """"" when the kernel matches float64 on shapes with every tail (rows past a block of 4, weight rows short of a
    group of 4, K and N not multiples of 16 or 128) and NaN in x stays in its row; else what went wrong."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 301, generator=g)
    w = torch.randn(1, 301, 139, generator=g)  # rhs orientation [1, K, N]
    q, s = quantize(w, dtype)
    w64 = dequantize(q, s).double()[0]
    got = _rows(x, q[0].t().contiguous(), _expert_scale(q.dtype, s[0])).double()
    ref = x.double() @ w64
    err = float((got - ref).abs().max() / ref.abs().max())
    if not err <= 1e-5:
        return f"the native quantized kernel's self-test missed float64 by {err:.1e} (bound 1e-05)"
    x[2, 3] = float("nan")
    poisoned = _rows(x, q[0].t().contiguous(), _expert_scale(q.dtype, s[0]))
    if not (bool(poisoned[2].isnan().all()) and not bool(poisoned[[0, 1, 3, 4, 5, 6]].isnan().any())):
        return "the native quantized kernel's self-test lost or spread a NaN"
    return ""


def _expert_scale(dtype: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """One expert's scale as the C kernel reads it: int8 [1, N] -> [N]; float8 [KB, NB] as it is (contiguous)."""
    return (scale.reshape(-1) if dtype == torch.int8 else scale).contiguous()


def x16_rows(x: torch.Tensor, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(int16 rows, float32 row scales) with x[m] ~ rows[m] * scales[m] (XBITS bits) for a bfloat16 x [M, K] (or for
    x[rows], rows an index), or None when those rows hold NaN or Inf (the float32 route keeps them). One native pass
    (kh_x16_rows), the gather included."""
    lib, _ = _library()
    assert lib is not None and x.dtype == torch.bfloat16
    x = x.contiguous()
    index = None if rows is None else rows.to(torch.int64).contiguous()
    m = x.shape[0] if index is None else index.shape[0]
    if index is not None and index.numel() and not 0 <= int(index.min()) <= int(index.max()) < x.shape[0]:
        raise IndexError(f"row index out of range for {x.shape[0]} rows")
    q = torch.empty((m, x.shape[1]), dtype=torch.int16)
    scales = torch.empty(m, dtype=torch.float32)
    fn = getattr(lib, "kh_x16_rows" + isa().suffix)
    if fn(x.data_ptr(), None if index is None else index.data_ptr(), q.data_ptr(), scales.data_ptr(), m, x.shape[1]):
        return None
    return q, scales


@functools.cache
def x16_available() -> tuple[bool, str]:
    """(does the int8 x bfloat16 int16-lhs route run here, why): its instructions (x16_suffix: AVX512-VNNI, or
    AVX2), the build, and a self-test against float64 within 1e-4 (the lhs rounding) on every tail."""
    ok, why = available(torch.int8)
    if not ok:
        return False, why
    if x16_suffix(isa(), _flags()) is None:
        return False, "this CPU lacks avx512_vnni for the int8 x bfloat16 route"
    g = torch.Generator().manual_seed(2)
    w = torch.randn(1, 1100, 139, generator=g)  # K past one int32 span, and not a multiple of 32
    q, s = quantize(w, torch.int8)
    x = torch.randn(7, 1100, generator=g).to(torch.bfloat16)
    rows = x16_rows(x)
    assert rows is not None
    out = torch.empty((7, 139))
    items = torch.tensor([[0, 0, 7]], dtype=torch.int64)
    grouped_x16(rows, q.transpose(1, 2).contiguous(), s.contiguous(), out, items, torch.zeros(1, dtype=torch.int32))
    ref = x.double() @ dequantize(q, s).double()[0]
    err = float((out.double() - ref).abs().max() / ref.abs().max())
    if not err <= 1e-4:
        return False, f"the int8 x bfloat16 VNNI route's self-test missed float64 by {err:.1e} (bound 1e-04)"
    route = "AVX512-VNNI" if isa().suffix == "" else "AVX2 (VPMADDWD)"
    return True, f"native {route} int8 x bfloat16 route (self-test passed)"


@functools.cache
def available(dtype: torch.dtype) -> tuple[bool, str]:
    """(can `dtype` weights run natively here, why). Builds and self-tests the kernel once per process."""
    name = str(dtype).replace("torch.", "")
    build = isa()
    return native_rows.gate(dtype, known=_ROWS, flags=build.flags, kernel="native quantized kernel",
                            for_cpu="native quantized kernel", library=_library, self_test=_self_test,
                            passed=f"native {build.name} {name} weight rows kernel (self-test passed)")


def _rows(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    lib, _ = _library()
    assert lib is not None
    out = torch.empty((x.shape[0], w.shape[0]), dtype=torch.float32)
    sk, sn = scale_strides(w.dtype, scale)
    fn = getattr(lib, _ROWS[w.dtype] + isa().suffix)
    fn(x.data_ptr(), w.data_ptr(), scale.data_ptr(), out.data_ptr(), x.shape[0], w.shape[0], w.shape[1], sk, sn)
    return out


def grouped(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, items: torch.Tensor,
            next_item: torch.Tensor) -> None:
    """out[rows of item] = x[rows of item] @ dequant(w[expert])^T for every item not yet taken through `next_item`.
    x float32 [rows, K], w [E, N, K] int8/float8, scale [E, 1, N] (int8) or [E, KB, NB] (float8) float32, out float32
    [rows, N]; all contiguous; every item at most MAX_ROWS rows. Releases the GIL while it runs."""
    lib, _ = _library()
    assert lib is not None
    sk, sn = scale_strides(w.dtype, scale[0])
    fn = getattr(lib, _GROUPED[w.dtype] + isa().suffix)
    fn(x.data_ptr(), w.data_ptr(), scale.data_ptr(), out.data_ptr(), items.data_ptr(), items.shape[0], w.shape[1],
       w.shape[2], sk, sn, scale[0].numel(), next_item.data_ptr())


def grouped_x16(x: tuple[torch.Tensor, torch.Tensor], w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor,
                items: torch.Tensor, next_item: torch.Tensor) -> None:
    """`grouped` for int8 weights with the lhs as x16_rows (rows, row scales): the int16-lhs route (check
    x16_available). out float32, or bfloat16 (each output rounded once from its float32 value, as .to() would)."""
    lib, _ = _library()
    assert lib is not None and w.dtype == torch.int8
    rows, row_scales = x
    assert out.dtype in (torch.float32, torch.bfloat16)
    fn = getattr(lib, "kh_q_grouped_i8_x16" + (x16_suffix(isa(), _flags()) or "")
                 + ("_bf16" if out.dtype == torch.bfloat16 else ""))
    fn(rows.data_ptr(), row_scales.data_ptr(), w.data_ptr(), scale.data_ptr(), out.data_ptr(), items.data_ptr(),
       items.shape[0], w.shape[1], w.shape[2], 0, 1, scale[0].numel(), next_item.data_ptr())
