"""One MoE expert layer at Qwen3-30B-A3B geometry, decode batch 64: transformers vs the hub kernel.

Runs transformers' eager, grouped_mm and batched_mm experts implementations, the kernelized layer
(kernel-hub/ragged-dot-tpu through kh.kernelize: expert weights packed where this CPU allows) and the same
layer kernelized without packing (KERNEL_HUB_CPU_PACK=0), on the same weights and routing, interleaved with the order
rotated each round. The memory floor (every active expert's weights read once) is measured in the same rounds, as
the fastest of three passes over both cores, scaled to the active bytes: a copy by a pool of one-thread workers (as
the kernel's own workers run), one copy on torch's threads (a copy counts its reads and writes), and a read-only pass
by the pool. Their buffers sit in 2 MiB pages where the kernel's packed weights do (the kernel's own
advise_huge_pages), so the floor is never slowed by TLB misses the kernel avoids. Ratios are taken within each round, so
load that hits a round hits both sides: against grouped_mm in the one convention (timing.RATIO_CONVENTION: "x faster"
= grouped_mm's time / ours), against the floor and the read-only pass as time multiples (kernelized / floor: 1.2x the
floor is 20% above it); the table gives their median and interquartile range, the JSON every sample, min and max,
which pass set the floor, the load average, and the peak resident memory while kernelize packs the layer (first in
the process, and again warm).
Writes bench/out/moe_decode.json.

    python bench/moe_decode.py [--quick] [--dtypes bf16,f32] [--reps N] [--out PATH]
    python bench/moe_decode.py --quantize int8|fp8 [--reps N]   (kernelized int8/fp8 vs bf16: bench/moe_quantized.py)
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from moe_common import (
    FLOOR_COPY_BYTES,
    FLOOR_KINDS,
    GAP_S,
    GEOMETRY,
    active_bytes,
    build_layer,
    expert_bytes,
    routing,
)

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
FLOOR_CHUNKS = 32


def copy_bandwidth(nbytes: int = 256 << 20, reps: int = 5) -> float:
    """Bytes per second moved (read + write) by one large torch copy (torch's own threads)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t)
    return 2 * nbytes / statistics.median(times)


#: The read-only pass: eight independent sums of 64-byte loads, nothing else (compiled with -O3 -march=native, so
#: AVX512 where the CPU has it); torch's own reductions spend enough arithmetic per byte to fall behind a copy.
READ_LOOP_C = r"""
#include <stddef.h>
typedef float v16 __attribute__((vector_size(64)));
float kh_bench_read(const float *p, size_t n) {
    v16 a[8] = {{0}};
    size_t i = 0;
    for (; i + 128 <= n; i += 128)
        for (int j = 0; j < 8; j++) a[j] += *(const v16 *)(p + i + 16 * j);
    float s = 0;
    for (int j = 0; j < 8; j++) for (int l = 0; l < 16; l++) s += a[j][l];
    for (; i < n; i++) s += p[i];
    return s;
}
"""


def read_loop(compile_c: Any) -> tuple[Any, str]:
    """(read(tensor), how): the compiled read-only loop over a 64-byte-aligned float32 tensor (built with the kernel's
    own native_rows.compile_c), or None and torch's amax with the reason (a slower pass: the copies then set the
    floor)."""
    import ctypes

    lib, why = compile_c(READ_LOOP_C, ("-march=native",)) if compile_c else (None, "the kernel has no C build")
    if lib is None:
        return None, f"torch amax ({why})"
    fn = lib.kh_bench_read
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_float

    def read(t: torch.Tensor) -> None:
        assert t.data_ptr() % 64 == 0 and t.is_contiguous() and t.dtype == torch.float32
        fn(t.data_ptr(), t.numel())

    return read, "compiled read loop (8 x 64-byte sums)"


class FloorCopy:
    """Moves FLOOR_COPY_BYTES on every core, three ways: a copy in chunks taken from a shared counter by one-thread
    workers (the kernel's pool model: `pool_copy`), one torch copy on torch's own threads (`threads_copy`), and a
    read-only pass (each worker takes chunks and reduces them with amax: `pool_read`). A copy's time scaled by
    active_bytes / (2 * FLOOR_COPY_BYTES) is the time to read the active bytes once at the rate that copy moved bytes
    (read + write); the read's time scaled by active_bytes / FLOOR_COPY_BYTES is that time at the rate a read-only pass
    reached. Each round's floor is the fastest of the three."""

    def __init__(self, workers: int, advise_huge_pages: Any = None, compile_c: Any = None) -> None:
        self.src = torch.ones(FLOOR_COPY_BYTES // 4, dtype=torch.float32)
        self.dst = torch.ones_like(self.src)
        # The same 2 MiB pages as the kernel's packed weights get (its own advise_huge_pages): the floor is the
        # fastest copy this machine makes, never one slowed by TLB misses the kernel does not pay.
        self.pages = [advise_huge_pages(t)[1] for t in (self.src, self.dst)] if advise_huge_pages else []
        self.workers = workers
        self.pool = ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,))
        self.chunks = list(zip(self.src.chunk(FLOOR_CHUNKS), self.dst.chunk(FLOOR_CHUNKS), strict=True))
        self.read_loop, self.read_how = read_loop(compile_c)

    def pool_copy(self) -> None:
        counter = itertools.count()

        def drain() -> None:
            while (i := next(counter)) < len(self.chunks):
                src, dst = self.chunks[i]
                dst.copy_(src)

        for f in [self.pool.submit(drain) for _ in range(self.workers)]:
            f.result()

    def threads_copy(self) -> None:
        self.dst.copy_(self.src)

    def pool_read(self) -> None:
        counter = itertools.count()
        read = self.read_loop or (lambda t: t.amax())

        def drain() -> None:
            while (i := next(counter)) < len(self.chunks):
                read(self.chunks[i][0])

        for f in [self.pool.submit(drain) for _ in range(self.workers)]:
            f.result()

    def close(self) -> None:
        self.pool.shutdown()


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_during(fn) -> tuple[Any, dict[str, float | None]]:
    """fn()'s result and the resident memory (MiB) before, at its peak during fn, and after (Linux: VmHWM reset via
    /proc/self/clear_refs; elsewhere the peak is None)."""
    before = _status_kib("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")
        resettable = True
    except OSError:
        resettable = False
    result = fn()
    peak = _status_kib("VmHWM") if resettable else None
    after = _status_kib("VmRSS")
    mib = lambda kib: None if kib is None else kib / 1024
    return result, {"rss_before_mib": mib(before), "peak_mib": mib(peak), "rss_after_mib": mib(after)}


def spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles, min and max of per-round values (timing.Spread's summary, as plain JSON)."""
    from dataclasses import asdict

    from kernel_hub.verify.timing import Spread

    return {k: v for k, v in asdict(Spread.of(values)).items() if k != "n"}


def bench_dtype(name: str, dtype: torch.dtype, *, batch: int, reps: int, batched_reps: int,
                floor: FloorCopy, calls: int = 1) -> dict[str, Any]:
    import kernel_hub as kh
    from kernel_hub.layers.kinds.experts.packing import ENV
    from kernel_hub.verify.numerics import relative_error
    from kernel_hub.verify.timing import Ratio, bench_records, interleaved_samples

    container, config = build_layer(dtype)
    packed_container = copy.deepcopy(container)  # packs in place: the other one keeps dense weights for the rest
    experts = container.experts
    hidden, index, weights = routing(batch, dtype)

    def run_with(impl: str):
        # The class-level forward is transformers' dispatcher: it follows config._experts_implementation
        # and ignores the instance forward kernelize gives this (non-PreTrainedModel) container's block.
        dispatch = type(experts).forward

        def run() -> torch.Tensor:
            config._experts_implementation = impl
            with torch.no_grad():
                return dispatch(experts, hidden, index, weights)
        return run

    eager, grouped, batched = run_with("eager"), run_with("grouped_mm"), run_with("batched_mm")
    reference = grouped()
    with mock.patch.dict(os.environ, {ENV: "0"}):  # this copy keeps the unpacked path
        kh.kernelize(container)
    report, memory = peak_rss_during(lambda: kh.kernelize_report(
        kh.kernelize(packed_container)))  # first packing in this process
    kh.restore(packed_container)  # unpacks in place; packing again measures a warm process (no one-time costs)
    report, warm = peak_rss_during(lambda: kh.kernelize_report(kh.kernelize(packed_container)))
    config._experts_implementation = "grouped_mm"

    def forward(block):
        def call() -> torch.Tensor:
            with torch.no_grad():
                return block(hidden, index, weights)
        return call

    kernelized, unpacked = forward(packed_container.experts), forward(experts)
    out = kernelized()
    variants = {"eager": eager, "grouped_mm": grouped, "kernelized": kernelized, "kernelized_unpacked": unpacked,
                "floor_pool": floor.pool_copy, "floor_threads": floor.threads_copy, "floor_read": floor.pool_read}
    times = interleaved_samples(variants, repeats=reps, warmup=1, gap_s=GAP_S, calls=calls)
    if batched_reps:  # seconds per call: timed apart, after the others, so it never precedes them
        times.update(interleaved_samples({"batched_mm": batched}, repeats=batched_reps, warmup=0))
    scale = active_bytes(index, dtype) / (2 * FLOOR_COPY_BYTES)
    for kind in FLOOR_KINDS:
        times[kind] = [t * scale * (2 if kind == "floor_read" else 1) for t in times[kind]]
    times["floor"] = [min(r) for r in zip(*(times[kind] for kind in FLOOR_KINDS), strict=True)]
    kern, grp, flo = times["kernelized"], times["grouped_mm"], times["floor"]
    replaced = report.replaced[0] if report.replaced else None
    result = {
        "dtype": name,
        "median_ms": {k: statistics.median(v) * 1e3 for k, v in times.items() if v},
        "samples_ms": {k: [t * 1e3 for t in v] for k, v in times.items()},
        "kernelized_vs_grouped_mm": Ratio.of(grp, kern).to_dict(),  # x faster: grouped_mm time / ours
        "kernelized_vs_floor": spread([k / f for k, f in zip(kern, flo, strict=True)]),
        "unpacked_vs_floor": spread([u / f for u, f in zip(times["kernelized_unpacked"], flo, strict=True)]),
        "kernelized_vs_read": spread([k / r for k, r in zip(kern, times["floor_read"], strict=True)]),
        "floor_from": {kind: sum(t == f for t, f in zip(times[kind], flo, strict=True)) for kind in FLOOR_KINDS},
        "max_rel_error_vs_grouped_mm": relative_error(out, reference),
        "packed_equals_unpacked": bool(torch.equal(out, unpacked())),
        "records": bench_records({k: v for k, v in times.items() if k not in FLOOR_KINDS},
                                 group=f"{name}, decode batch {batch}", baseline="grouped_mm"),
        "active_experts": int(torch.unique(index).numel()),
        "expert_mib": expert_bytes(dtype) / 2**20,
        "kernelize_memory": {"first": memory, "warm": warm},
        "implementation": replaced.implementation if replaced else None,
        "why": replaced.why if replaced else None,
        "variant": replaced.variant if replaced else None,
    }
    kh.restore(container)
    kh.restore(packed_container)
    return result


def _ratio(s: dict[str, float]) -> str:
    return f"{s['median']:.2f}x [{s['q1']:.2f}-{s['q3']:.2f}]"


def table(results: list[dict[str, Any]]) -> str:
    from kernel_hub.verify.timing import RATIO_CONVENTION, format_ratio

    cols = ["eager", "grouped_mm", "batched_mm", "kernelized_unpacked", "kernelized", "floor"]
    heads = ["eager", "grouped_mm", "batched_mm", "unpacked", "kernelized", "floor"]
    lines = [f"kernelized vs grouped_mm: {RATIO_CONVENTION}; vs floor / read-only: kernelized time / theirs",
             "dtype  " + "  ".join(f"{c:>10s}" for c in heads)
             + "  kernelized vs grouped_mm          time/floor [IQR]  time/read-only [IQR]  packed==unpacked  "
             "max rel err"]
    for r in results:
        ms = r["median_ms"]
        cells = "  ".join(f"{ms[c]:8.1f}ms" if c in ms else f"{'-':>10s}" for c in cols)
        lines.append(f"{r['dtype']:5s}  {cells}  {format_ratio(r['kernelized_vs_grouped_mm']):>32s}  "
                     f"{_ratio(r['kernelized_vs_floor']):>18s}  {_ratio(r['kernelized_vs_read']):>20s}  "
                     f"{r['packed_equals_unpacked']!s:>16s}  "
                     f"{r['max_rel_error_vs_grouped_mm']:.1e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 interleaved runs, no batched_mm (~1 min)")
    parser.add_argument("--dtypes", default="bf16,f32", help="comma list from: bf16, f32")
    parser.add_argument("--batch", type=int, default=64, help="decode batch (tokens)")
    parser.add_argument("--reps", type=int, default=None, help="interleaved runs per implementation (default 9)")
    parser.add_argument("--batched-reps", type=int, default=None,
                        help="runs of batched_mm (slow, gathers every selected expert's weights; default 1)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "moe_decode.json")
    parser.add_argument("--quantize", choices=("int8", "fp8"), default=None,
                        help="time the layer kernelized with quantized experts against kernelized bf16 instead")
    parser.add_argument("--calls", type=int, default=None,
                        help="back-to-back calls per timed sample, after the idle gap (default 4 with --quantize: a "
                             "decode step runs its layers back to back; 1 otherwise: one call, wake-up included)")
    args = parser.parse_args(argv)
    names = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in names if d not in DTYPES]
    if unknown:
        print(f"error: unknown dtype(s) {', '.join(unknown)}; choose from {', '.join(DTYPES)}", file=sys.stderr)
        return 2
    if args.calls is not None and args.calls < 1:
        print(f"error: --calls must be at least 1, not {args.calls}", file=sys.stderr)
        return 2
    reps = args.reps or (3 if args.quick else 9)
    batched_reps = args.batched_reps if args.batched_reps is not None else (0 if args.quick else 1)
    load_before = os.getloadavg()
    bandwidth = copy_bandwidth()
    print(f"Qwen3-30B-A3B MoE layer {GEOMETRY}, decode batch {args.batch}, {torch.get_num_threads()} threads; "
          f"one-call copy bandwidth {bandwidth / 1e9:.1f} GB/s (read+write); load average "
          f"{' '.join(f'{x:.2f}' for x in load_before)}")
    import kernel_hub as kh

    kernel = kh.get_kernel("kernel-hub/ragged-dot-tpu", framework="torch", backend="cpu")
    packed = getattr(kernel, "PackedExperts", None)  # its module holds the kernel's native_rows (the C build)
    native = getattr(sys.modules.get(packed.__module__), "native_rows", None) if packed else None
    floor = FloorCopy(torch.get_num_threads(), getattr(kernel, "advise_huge_pages", None),
                      getattr(native, "compile_c", None))
    print(f"floor buffers: {', '.join(floor.pages) or 'ordinary pages'}; read-only pass: {floor.read_how}")
    if args.quantize:  # bench/moe_quantized.py: quantized vs bf16, both kernelized, in one run
        from moe_quantized import main_quantized

        try:
            return main_quantized(args.quantize, batch=args.batch, reps=reps, floor=floor, calls=args.calls or 4,
                                  out=args.out.with_name(f"moe_decode_{args.quantize}.json"))
        finally:
            floor.close()
    try:
        results = [bench_dtype(n, DTYPES[n], batch=args.batch, reps=reps, batched_reps=batched_reps, floor=floor,
                               calls=args.calls or 1)
                   for n in names]
    finally:
        floor.close()
    load_after = os.getloadavg()
    print(table(results))
    for r in results:
        for when, mem in r["kernelize_memory"].items():
            if mem["peak_mib"] is not None:
                print(f"{r['dtype']}: kernelize ({when}) peak RSS {mem['peak_mib'] - mem['rss_before_mib']:+.1f} MiB "
                      f"over the {mem['rss_before_mib']:.0f} MiB before (one expert: {r['expert_mib']:.1f} MiB), "
                      f"after {mem['rss_after_mib'] - mem['rss_before_mib']:+.1f} MiB")
        print(f"{r['dtype']}: {r['implementation']}: {r['why']}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in load_after)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from kernel_hub.report.environment import environment

    args.out.write_text(json.dumps({
        "benchmark": "moe_decode", "baseline": "grouped_mm", "ours": ["kernelized"],
        "records": [rec for r in results for rec in r["records"]],
        "geometry": GEOMETRY, "batch": args.batch, "threads": torch.get_num_threads(), "reps": reps,
        "environment": {**environment(with_libtpu=False).model_dump(), "processor": platform.processor(),
                        "load_average_before": load_before, "load_average_after": load_after},
        "one_call_copy_bandwidth_gbs": bandwidth / 1e9, "floor_copy_bytes": FLOOR_COPY_BYTES,
        "floor_pages": floor.pages, "floor_read_how": floor.read_how,
        "results": results,
    }, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
