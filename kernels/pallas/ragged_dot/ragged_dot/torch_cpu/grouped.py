"""The torch-native ragged dot: one matmul per non-empty group, spread over a small thread pool.

Why not jax or torch's own grouped_mm on CPU: at decode sizes (a few rows per expert) the work is
reading each active expert's weights once, and one BLAS call per expert, run on a single core, is
compute-bound at a fraction of the memory bandwidth. Running disjoint experts on separate workers
(each pinned to one intra-op thread) uses every core without the fork/join of OpenMP per tiny
matmul. Imports torch only: this file ships in the torch-cpu build, where jax may be absent.

Under torch.compile the grouped matmuls run as torch custom ops (`kernel_hub_ragged_dot_v<version>::cpu_grouped`
and `::cpu_grouped_tn`, with fake implementations for their shapes and a registered backward): dynamo never traces
the host-side group loop (its sizes are data) and inductor never sees the oneDNN call inside. Eager calls skip the
op dispatch; both run the same grouped_matmul, so compiled and eager numbers are the same.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .._vendor.torch_tpu_ops import op_namespace, package_digest
from ..release import VERSION
from . import native_rows

#: Below this many multiply-adds a call runs inline: the pool's hand-off costs ~20 us per worker.
MIN_PARALLEL_MACS = 4_000_000

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_workers = 0
_in_worker = threading.local()


def _init_worker() -> None:
    torch.set_num_threads(1)  # per-thread for OpenMP/MKL: each worker owns one core
    _in_worker.flag = True


def num_workers() -> int:
    """Workers to use: the caller's intra-op thread count (KERNEL_HUB_CPU_WORKERS overrides)."""
    env = os.environ.get("KERNEL_HUB_CPU_WORKERS")
    if env:
        return max(1, int(env))
    return max(1, torch.get_num_threads())


def _get_pool(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is None or _pool_workers != workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="ragged-dot", initializer=_init_worker)
            _pool_workers = workers
        return _pool


def _onednn_linear():
    """oneDNN's linear, when this torch has it: for float32 with few rows per group it is ~1.5x
    faster than the BLAS behind torch.mm on some CPUs (no vendor-specific dispatch)."""
    if os.environ.get("KERNEL_HUB_CPU_ONEDNN", "1") == "0" or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


_LINEAR = _onednn_linear()


@functools.cache
def onednn_bf16() -> bool:
    """Whether oneDNN runs bfloat16 linears on this CPU (it needs AVX512 or AMX: on an AVX2-only CPU it refuses to
    build the primitive and raises, so bfloat16 groups keep torch.mm there)."""
    return _LINEAR is not None and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _plain_2d(t: torch.Tensor) -> bool:
    """Row- or column-major without gaps: a layout oneDNN reads as a plain weight."""
    return t.is_contiguous() or t.t().is_contiguous()


#: Fewer rows than this go to oneDNN's linear padded with zero rows. Why: on AVX512 CPUs its kernels are
#: register-blocked for up to 6 rows, and 1-5 rows stream the same weights more slowly than 6 (measured on a Zen 4
#: EPYC, packed weights, two workers: 1.3-1.7x the memory floor at 1-3 rows, 1.1-1.4x at 5-6). Padding adds only
#: arithmetic, never weight reads, and never changes a real row's sums (each output row is its own dot products;
#: packed.py's probe checks packed against unpacked bit for bit at every row count through this function).
MIN_LINEAR_ROWS = 6


def linear_for_group(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a @ b takes oneDNN's linear rather than torch.mm: on CPU with b plain in either major order, float32
    groups and single bfloat16 rows (torch.mm's one-row bfloat16 kernel sums differently from the blocked kernel that
    padded rows take; from two rows on torch.mm agrees with it and is faster on plain weights). The packed-weights
    path (packed.py) is checked bit for bit against this choice."""
    if _LINEAR is None or a.device.type != "cpu" or not _plain_2d(b):
        return False
    return b.dtype == torch.float32 or (b.dtype == torch.bfloat16 and a.shape[0] == 1 and onednn_bf16())


def onednn_linear(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """oneDNN's a @ w^T, w a plain [N, K] weight or one packed by packed.py (both paths call this).

    Fewer than MIN_LINEAR_ROWS rows run padded to it. That also keeps a single float32 row off oneDNN's
    matrix-vector kernel for plain weights, whose sums differ in the last bits from the blocked kernels that packed
    weights always use: packed and unpacked agree bit for bit at every row count."""
    linear = torch.ops.mkldnn._linear_pointwise
    rows = a.shape[0]
    if 0 < rows < MIN_LINEAR_ROWS:
        padded = torch.nn.functional.pad(a, (0, 0, 0, MIN_LINEAR_ROWS - rows))
        return linear(padded, w, None, "none", [], "")[:rows]
    return linear(a, w, None, "none", [], "")


def _mm_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out = a @ b for one group (b is [K, N]: a transposed view of nn.Linear-style weights, or [K, N] itself).
    Decode-sized groups against a plain [N, K] weight run on the native rows kernel where it is available."""
    if native_rows.fits(a, b.t()) and out.is_contiguous():
        native_rows.linear(a, b.t(), out)
    elif linear_for_group(a, b):
        out.copy_(onednn_linear(a, b.t()))
    else:
        torch.mm(a, b, out=out)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b exactly as the grouped loop computes one group (what packed weights are checked against)."""
    if native_rows.fits(a, b.t()):  # the route _mm_into takes, without its copy
        return native_rows.linear(a, b.t())
    out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    _mm_into(a, b, out)
    return out


def nonempty_groups(sizes: list[int], m: int) -> list[tuple[int, int, int]]:
    """(group, start, end) of every non-empty group, clamped to m rows (the jax contract)."""
    out, start = [], 0
    for g, size in enumerate(sizes):
        end = min(start + max(size, 0), m)
        if end > start:
            out.append((g, start, end))
        start = end
    return out


def spread(tasks: list[Callable[[], None]]) -> None:
    """Run the tasks on the pool at once and wait for all. Every worker runs with one intra-op thread; the caller
    only waits (working itself, with its own multi-threaded BLAS, would oversubscribe the cores)."""
    pool = _get_pool(num_workers())
    for f in [pool.submit(task) for task in tasks]:
        f.result()


def runs_inline(workers: int, macs: int) -> bool:
    """Whether a grouped call runs in the caller: one worker, too little work to spread, or already on a worker."""
    return workers <= 1 or macs < MIN_PARALLEL_MACS or getattr(_in_worker, "flag", False)


def run_groups(items: list[tuple[int, int, int]], one: Callable[[int, int, int], None], macs: int) -> None:
    """Call one(group, start, end) for every item: inline when small or nested, else on the pool.

    Workers take the next group from a shared counter (dynamic scheduling), so a core slowed by
    another process only does fewer groups instead of holding up the call.
    """
    workers = min(num_workers(), len(items))
    if runs_inline(workers, macs):
        with torch.no_grad():
            for item in items:
                one(*item)
        return
    order = sorted(items, key=lambda it: it[2] - it[1], reverse=True)  # big groups first
    counter = itertools.count()  # next() is atomic under the GIL

    def drain() -> None:
        with torch.no_grad():
            while (i := next(counter)) < len(order):
                one(*order[i])

    spread([drain] * workers)


def native_groups(lhs: torch.Tensor, rhs: torch.Tensor, items: list[tuple[int, int, int]],
                  out: torch.Tensor) -> list[tuple[int, int, int]]:
    """Run the items the native rows kernel takes (at most native_rows.MAX_ROWS rows, a plain [G, N, K] weight
    stack behind rhs, contiguous rows) as one native call per worker, the workers sharing a counter inside it: no
    return to Python per group. Each output equals what _mm_into computes for its group, bit for bit (the same
    kernel, the same sums). Returns the items left for the per-group loop."""
    w = rhs.transpose(1, 2)
    if not (items and lhs.is_contiguous() and w.is_contiguous() and out.is_contiguous()
            and native_rows.fits(lhs[items[0][1]:items[0][1] + 1], w[0])):
        return items
    small = sorted((it for it in items if it[2] - it[1] <= native_rows.MAX_ROWS),
                   key=lambda it: it[2] - it[1], reverse=True)  # big groups first
    if not small:
        return items
    table = native_rows.grouped_items(small)
    counter = torch.zeros(1, dtype=torch.int32)

    def drain() -> None:
        native_rows.grouped(lhs, w, out, table, counter)

    workers = min(num_workers(), len(small))
    k, n = lhs.shape[1], w.shape[1]
    if runs_inline(workers, sum(e - s for _, s, e in small) * k * n):
        drain()
    else:
        spread([drain] * workers)
    return [it for it in items if it[2] - it[1] > native_rows.MAX_ROWS]


def grouped_matmul(lhs: torch.Tensor, rhs: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """out[rows of g] = lhs[rows of g] @ rhs[g]; rows past sum(sizes) are zero. No autograd."""
    m, k = lhs.shape
    n = rhs.shape[2]
    items = nonempty_groups(sizes, m)
    covered = items[-1][2] if items else 0
    out = torch.empty((m, n), dtype=lhs.dtype, device=lhs.device)
    if covered < m:
        out[covered:].zero_()
    rest = native_groups(lhs, rhs, items, out)

    def one(g: int, s: int, e: int) -> None:
        _mm_into(lhs[s:e], rhs[g], out[s:e])

    run_groups(rest, one, sum(e - s for _, s, e in rest) * k * n)
    return out


def grouped_matmul_tn(lhs: torch.Tensor, dout: torch.Tensor, sizes: list[int], g: int) -> torch.Tensor:
    """d_rhs[g] = lhs[rows of g]^T @ dout[rows of g]; zero for empty groups. No autograd."""
    m, k = lhs.shape
    n = dout.shape[1]
    items = nonempty_groups(sizes, m)
    out = torch.zeros((g, k, n), dtype=lhs.dtype, device=lhs.device)

    def one(grp: int, s: int, e: int) -> None:
        torch.mm(lhs[s:e].t(), dout[s:e], out=out[grp])

    run_groups(items, one, (items[-1][2] if items else 0) * k * n)
    return out


class _RaggedDot(torch.autograd.Function):
    """Autograd for the grouped matmul: d_lhs is a grouped matmul against rhs^T, d_rhs a per-group
    lhs^T @ dout. Sizes travel as a Python list (one host sync per call, like torch's fallback)."""

    @staticmethod
    def forward(ctx, lhs, rhs, group_sizes):  # type: ignore[override]
        sizes = sizes_list(group_sizes)
        ctx.sizes = sizes
        ctx.save_for_backward(lhs, rhs)
        return grouped_matmul(lhs, rhs, sizes)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        lhs, rhs = ctx.saved_tensors
        dout = dout.contiguous()
        d_lhs = d_rhs = None
        if ctx.needs_input_grad[0]:
            d_lhs = grouped_matmul(dout, rhs.transpose(1, 2), ctx.sizes)
        if ctx.needs_input_grad[1]:
            d_rhs = grouped_matmul_tn(lhs, dout, ctx.sizes, rhs.shape[0])
        return d_lhs, d_rhs, None


def sizes_list(group_sizes: torch.Tensor) -> list[int]:
    """A group-sizes tensor as Python ints (the custom ops take a tensor; the loops take a list)."""
    return [int(s) for s in group_sizes.tolist()]


def custom_op(name: str, schema: str, fn: Callable[..., torch.Tensor], fake: Callable[..., torch.Tensor]) -> Any:
    """The custom op `name` of this build (version and content), registered once per process (a second load of the
    same build reuses it; another build of the same version gets its own namespace)."""
    qualname = f"{op_namespace('ragged_dot', VERSION, package_digest(Path(__file__).parents[1]))}::{name}"
    from torch._library import custom_ops

    existing = custom_ops._maybe_get_opdef(qualname)
    if existing is not None:
        return existing
    op = torch.library.custom_op(qualname, fn, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op


_GROUPED = custom_op(
    "cpu_grouped", "(Tensor lhs, Tensor rhs, Tensor group_sizes) -> Tensor",
    lambda lhs, rhs, group_sizes: grouped_matmul(lhs, rhs, sizes_list(group_sizes)),
    lambda lhs, rhs, group_sizes: lhs.new_empty((lhs.shape[0], rhs.shape[2])))
_GROUPED_TN = custom_op(
    "cpu_grouped_tn", "(Tensor lhs, Tensor dout, Tensor group_sizes, int groups) -> Tensor",
    lambda lhs, dout, group_sizes, groups: grouped_matmul_tn(lhs, dout, sizes_list(group_sizes), groups),
    lambda lhs, dout, group_sizes, groups: lhs.new_empty((groups, lhs.shape[1], dout.shape[1])))


def _op_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    lhs, rhs, group_sizes = inputs
    ctx.save_for_backward(lhs, rhs, group_sizes)


def _op_backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
    lhs, rhs, group_sizes = ctx.saved_tensors
    dout = dout.contiguous()
    d_lhs = _GROUPED(dout, rhs.transpose(1, 2), group_sizes) if ctx.needs_input_grad[0] else None
    d_rhs = _GROUPED_TN(lhs, dout, group_sizes, rhs.shape[0]) if ctx.needs_input_grad[1] else None
    return d_lhs, d_rhs, None


if not getattr(_GROUPED, "_kernel_hub_autograd", False):
    _GROUPED.register_autograd(_op_backward, setup_context=_op_setup)
    _GROUPED._kernel_hub_autograd = True


def compiling() -> bool:
    """Whether torch.compile is tracing this call (then no host syncs, Python branches on data or thread pools)."""
    return torch.compiler.is_compiling()


def ragged_dot_torch(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """Torch-native ragged dot with autograd (see module docstring for why it is shaped this way)."""
    if compiling():
        return _GROUPED(lhs, rhs, group_sizes)
    if torch.is_grad_enabled() and (lhs.requires_grad or rhs.requires_grad):
        return _RaggedDot.apply(lhs, rhs, group_sizes)
    return grouped_matmul(lhs.detach(), rhs.detach(), sizes_list(group_sizes))


def on_worker(fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """fn() on one pool worker (one intra-op thread), the caller waiting; inline when the pool is off or this is a
    worker. For whole-tensor steps between the grouped loops: in the caller they fork OpenMP threads, which stall for
    milliseconds when another process holds a core. No autograd: the worker runs under no_grad."""
    if num_workers() <= 1 or getattr(_in_worker, "flag", False):
        return fn()

    def run() -> torch.Tensor:
        with torch.no_grad():
            return fn()

    return _get_pool(num_workers()).submit(run).result()


class Routing(NamedTuple):
    """Where every (token, slot) row goes, in expert order: shared by moe_experts and moe_experts_packed."""

    sorted_ids: torch.Tensor  # [T*K] expert ids, ascending (stable)
    perm: torch.Tensor  # [T*K] the flat (token, slot) index of each sorted row
    sizes: torch.Tensor  # [E] rows per expert; sentinel ids (>= E) sort to the tail and are left out
    in_range: torch.Tensor  # [T*K] False for sentinel rows (expert-parallel drops)


def route(top_k_index: torch.Tensor, num_experts: int) -> Routing:
    """Sort the routed rows by expert (stable, so rows keep token order within an expert)."""
    sorted_ids, perm = torch.sort(top_k_index.reshape(-1), stable=True)
    counted = sorted_ids.clamp(0, num_experts)  # sentinels (>= E) land in bin E, dropped below
    sizes = torch.zeros(num_experts + 1, dtype=torch.long, device=sorted_ids.device)
    sizes = sizes.scatter_add(0, counted, torch.ones_like(counted))[:num_experts]  # bincount, of static length
    return Routing(sorted_ids, perm, sizes, sorted_ids < num_experts)


def activate(h: torch.Tensor, *, act: Callable[[torch.Tensor], torch.Tensor], has_gate: bool, concatenated: bool,
             gate_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """The expert block's middle step: gate_fn(h) if given, else act(gate) * up (halves stacked [gate; up] when
    concatenated, interleaved g0, u0, g1, u1, ... otherwise), or act(h) for an ungated up projection. Elementwise:
    the same on all rows at once (moe_experts) as expert by expert (moe_experts_packed)."""
    if gate_fn is not None:
        return gate_fn(h)
    if not has_gate:
        return act(h)
    g, u = h.chunk(2, dim=-1) if concatenated else (h[..., ::2], h[..., 1::2])
    return act(g) * u


def combine_experts(out: torch.Tensor, top_k_weights: torch.Tensor, perm: torch.Tensor, in_range: torch.Tensor,
                    num_tokens: int, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """The expert block's last step, shared by moe_experts and moe_experts_packed (so they agree bit for bit): weight
    each row (in expert order, `perm` from the stable sort) by its routing weight, zero the rows of dropped ids, and
    sum each token's top_k rows. Returns [tokens, hidden] in `dtype`. On CPU without autograd the tokens are split
    over the workers; each token's sum is the same computation either way (tests/test_kernelize_packed_kernel.py
    checks)."""
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    flat_weights = top_k_weights.reshape(-1)
    masked = compiling() or not bool(in_range.all())  # compiled: always masked (a no-op mask where none is dropped)

    def tokens(t0: int, t1: int) -> torch.Tensor:
        at = inverse[t0 * top_k:t1 * top_k]  # token-major: token t's top_k rows
        rows, weights = out[at], flat_weights[t0 * top_k:t1 * top_k]
        if masked:
            keep = in_range[at]
            weights = weights.masked_fill(~keep, 0.0)
            rows = rows.masked_fill(~keep[:, None], 0.0)
        return (rows * weights.unsqueeze(-1)).view(t1 - t0, top_k, -1).sum(dim=1).to(dtype)

    needs_grad = torch.is_grad_enabled() and (out.requires_grad or top_k_weights.requires_grad)
    if compiling() or out.device.type != "cpu" or needs_grad or getattr(_in_worker, "flag", False):
        return tokens(0, num_tokens)
    workers = min(num_workers(), num_tokens)
    if workers <= 1:
        return tokens(0, num_tokens)
    result = torch.empty((num_tokens, out.shape[1]), dtype=dtype)
    bounds = [num_tokens * i // workers for i in range(workers + 1)]

    def part(t0: int, t1: int) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                result[t0:t1] = tokens(t0, t1)
        return run

    spread([part(a, b) for a, b in itertools.pairwise(bounds) if b > a])
    return result
