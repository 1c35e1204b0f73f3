"""Expert weights prepared once at load time for the torch CPU path (kernelize, inference), two ways.

Why: at decode sizes a MoE layer's time is reading its experts' weights once.

- Native (nn.Linear-style [E, N, K] stacks, where native_rows.available): the weights stay exactly as they are and
  the native rows kernel streams them; the block runs the unpacked loop's own grouped_matmul on the very same tensors
  (one native call per worker per projection), so packed and unpacked agree by construction.
- oneDNN (transposed layouts, or no native kernel): oneDNN's linear wants each weight in its own blocked layout;
  handed a plain weight it works from that on every call. Packing once (`torch.ops.mkldnn._reorder_linear_weight`,
  what Inductor's freezing pass does) leaves only the read, and running both projections of an expert in one task on
  the grouped loop's workers (grouped.run_groups) keeps each core streaming weights.

Either way the bytes are then collapsed into 2 MiB pages where Linux allows (huge_pages.py: fewer TLB misses).

Memory (oneDNN): the packed layout of an expert is as large as the original for the layouts this is used on, so each
expert is packed into its own bytes (in place) and memory grows by one expert at most while packing. A oneDNN tensor
over memory torch already owns is made through torch's AOTInductor C shim (`aoti_torch_create_tensor_from_blob_v2`,
mkldnn layout), the way AOTInductor loads packed constants; `packing_support` probes that route once and refuses where
it is missing. `PackedExperts.unpack` writes the original bytes back (oneDNN's reorder is a permutation: bit for bit).

Numbers (oneDNN): before anything is packed, the packed linear is compared bit for bit with the unpacked grouped loop
(grouped.matmul) on the layer's own first expert for every row count in PROBE_ROWS, and the first reorder batch hint
that agrees is the one used (both paths share grouped.onednn_linear, which keeps oneDNN off its one-row kernel). None
agreeing: nothing is packed.

Imports torch only (the torch-cpu build runs where jax is absent); never imports kernel_hub.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from collections.abc import Callable
from typing import Any

import torch

from . import native_rows
from .grouped import (
    activate,
    combine_experts,
    grouped_matmul,
    matmul,
    nonempty_groups,
    on_worker,
    onednn_linear,
    route,
    run_groups,
)
from .huge_pages import advise_huge_pages

#: Weight dtypes packing covers (float16 has no oneDNN linear on CPUs without AVX512-FP16/AMX-FP16).
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
#: Reorder batch hints, tried in this order (fastest first at decode rows per expert, measured on AVX512 CPUs).
HINTS = (16, 4, 64, 1)
#: Row counts at which the packed linear must equal the unpacked grouped loop before a weight is packed.
PROBE_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33, 64)
_OPS = ("_reorder_linear_weight", "_linear_pointwise", "_nbytes", "_get_mkldnn_serialized_md", "data_ptr")

class PackingError(RuntimeError):
    """A weight cannot be packed; the message says why (the caller keeps the unpacked path)."""


# --- oneDNN tensors over memory torch owns (AOTInductor's C shim) -------------------------------------------------


class _BlobApi:
    """ctypes handles on the C shim functions that build a tensor over existing memory."""

    def __init__(self, lib: Any) -> None:
        def code(name: str) -> int:
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int32
            fn.argtypes = []
            return int(fn())

        self.create = lib.aoti_torch_create_tensor_from_blob_v2
        self.create.restype = ctypes.c_int32
        self.create.argtypes = [
            ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
            ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64,
        ]
        self.dtypes = {torch.float32: code("aoti_torch_dtype_float32"),
                       torch.bfloat16: code("aoti_torch_dtype_bfloat16")}
        self.cpu = code("aoti_torch_device_type_cpu")
        self.mkldnn = code("aoti_torch_layout__mkldnn")
        self.steal = torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr
        self.capsule = ctypes.pythonapi.PyCapsule_New
        self.capsule.restype = ctypes.py_object
        self.capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    def view(self, ptr: int, shape: tuple[int, int], dtype: torch.dtype, md: torch.Tensor) -> torch.Tensor:
        """A oneDNN tensor of `shape` whose (packed) bytes are the memory at `ptr`; it does not own that memory."""
        sizes = (ctypes.c_int64 * 2)(*shape)
        strides = (ctypes.c_int64 * 2)(shape[1], 1)
        handle = ctypes.c_void_p()
        md = md.contiguous()
        rc = self.create(ptr, 2, sizes, strides, 0, self.dtypes[dtype], self.cpu, 0, ctypes.byref(handle),
                         self.mkldnn, md.data_ptr(), md.numel())
        if rc != 0 or not handle.value:
            raise PackingError(f"torch's C shim refused a oneDNN tensor over existing memory (code {rc})")
        return self.steal(self.capsule(handle.value, None, None))


@functools.cache
def _blob_api() -> tuple[_BlobApi | None, str]:
    libs = [None] + sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "*torch_cpu*")))
    last = "no library exports it"
    for path in libs:
        try:
            return _BlobApi(ctypes.CDLL(path)), ""
        except (OSError, AttributeError) as exc:
            last = f"{type(exc).__name__}: {exc}"
    return None, f"torch's AOTInductor C shim (aoti_torch_create_tensor_from_blob_v2) is not reachable ({last})"


# --- capability ---------------------------------------------------------------------------------------------------


def _storage_users(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


@functools.cache
def _sole_user_count() -> int:
    return _storage_users(torch.empty(1))


def shares_memory(t: torch.Tensor) -> bool:
    """True when another tensor (a view, a state_dict entry someone holds, a tied weight) uses `t`'s memory: packing
    it in place would change what that tensor reads."""
    try:
        return _storage_users(t) != _sole_user_count()
    except (AttributeError, RuntimeError):  # no way to tell: assume shared
        return True


@functools.cache
def packing_support(dtype: torch.dtype) -> tuple[bool, str]:
    """(can this process pack `dtype` expert weights in place, why): by the native rows kernel (nn.Linear-style
    layouts) or oneDNN (every layout); each probed once."""
    native, native_why = native_rows.available(dtype)
    onednn, onednn_why = onednn_support(dtype)
    if not (native or onednn):
        return False, f"{native_why}; {onednn_why}"
    return True, "; ".join(why for ok, why in ((native, native_why), (onednn, onednn_why)) if ok)


@functools.cache
def onednn_support(dtype: torch.dtype) -> tuple[bool, str]:
    """(can oneDNN pack `dtype` expert weights in place here, why): the route of transposed stacks, and of every stack
    where the native kernel is missing. Probes oneDNN and the in-place route once."""
    name = str(dtype).replace("torch.", "")
    if dtype not in SUPPORTED_DTYPES:
        return False, f"{name} weights: packing covers float32 and bfloat16"
    if not torch.backends.mkldnn.is_available():
        return False, "this torch has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if not torch.backends.mkldnn.enabled:
        return False, "oneDNN is disabled (torch.backends.mkldnn.enabled is False)"
    missing = [op for op in _OPS if not _has_op(op)]
    if missing:
        return False, f"this torch lacks torch.ops.mkldnn.{', '.join(missing)}"
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False, "oneDNN bfloat16 is not supported on this CPU (needs AVX512-BF16, AVX512 or AMX)"
    api, why = _blob_api()
    if api is None:
        return False, why
    try:  # a small stack through the whole route: pack in place, run, unpack, bit for bit
        g = torch.Generator().manual_seed(0)
        weight = torch.randn(3, 64, 64, generator=g).to(dtype)
        original = weight.clone()
        packed = _pack_onednn(weight, transposed=True, check_rows=(1, 2, 5))
        x = torch.randn(5, 64, generator=g).to(dtype)
        if not torch.equal(packed.linear(1, x), matmul(x, original[1])):
            return False, "the oneDNN probe's packed linear differs from the unpacked path"
        if not torch.equal(packed.unpack(), original):
            return False, "the oneDNN probe did not unpack to its original bytes"
    except Exception as exc:  # any failure of a private route means: do not pack
        return False, f"the oneDNN packing probe failed: {type(exc).__name__}: {exc}"
    return True, f"oneDNN {name} linear with packed weights (probe passed)"


def _has_op(name: str) -> bool:
    try:
        getattr(torch.ops.mkldnn, name)
        return True
    except (AttributeError, RuntimeError):
        return False


# --- packing ------------------------------------------------------------------------------------------------------


def _matrix(weight: torch.Tensor, e: int, transposed: bool) -> torch.Tensor:
    """Expert e as an nn.Linear weight [N, K] (a view; transposed stacks hold [K, N])."""
    return weight[e].t() if transposed else weight[e]


def exact_hint(w: torch.Tensor, rows: tuple[int, ...] = PROBE_ROWS) -> tuple[int | None, str]:
    """The first reorder hint whose packed linear equals the unpacked grouped loop bit for bit at every row count in
    `rows`, on this weight ([N, K]); (None, why) when none does."""
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(m, w.shape[1], generator=g).to(w.dtype) for m in rows]
    refs = [matmul(x, w.t()) for x in xs]
    tried = []
    for hint in HINTS:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, hint)
        bad = [m for m, x, ref in zip(rows, xs, refs, strict=True) if not torch.equal(onednn_linear(x, packed), ref)]
        del packed  # one packed copy alive at a time
        if not bad:
            return hint, f"batch hint {hint}"
        tried.append(f"hint {hint} differs at {bad[:3]} rows")
    return None, "packed linear is not bit-identical to the unpacked path (" + "; ".join(tried) + ")"


class PackedExperts:
    """A stacked expert weight ([E, N, K], or [E, K, N] with transposed=True) prepared for decode in place, one of two
    ways. oneDNN (`hint` set): each expert's memory holds oneDNN's packed layout until `unpack`, and `experts[e]` is a
    oneDNN view of it. Native (`hint` None, nn.Linear-style layouts where native_rows is available): the bytes are
    left exactly as they are and `experts[e]` is the plain [N, K] matrix, which the native rows kernel reads as it
    lies. Either way `tensor` is the original tensor object, and pickling and deepcopy store the dense values, never
    packed bytes, and pack again on load."""

    def __init__(self, tensor: torch.Tensor, transposed: bool, hint: int | None, experts: list[torch.Tensor]) -> None:
        self.tensor = tensor
        self.transposed = transposed
        self.hint = hint
        self.experts: list[torch.Tensor] | None = experts
        #: (bytes in 2 MiB pages, why): what backs the packed bytes (huge_pages.advise_huge_pages).
        self.huge_pages: tuple[int, str] = (0, "ordinary pages")

    @property
    def native(self) -> bool:
        """True when the bytes are the original layout, read by the native rows kernel (nothing was reordered)."""
        return self.hint is None

    @property
    def how(self) -> str:
        """The route, for the report."""
        return "native rows kernel on the original layout" if self.native else f"oneDNN batch hint {self.hint}"

    @property
    def packed(self) -> bool:
        return self.experts is not None

    @property
    def num_experts(self) -> int:
        return self.tensor.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    def linear(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """x @ W_e^T with expert e's packed weight (native: the unpacked loop's own product: equal by design)."""
        assert self.experts is not None, "unpacked"
        return matmul(x, self.experts[e].t()) if self.native else onednn_linear(x, self.experts[e])

    def _write_back(self, dest: torch.Tensor, e: int) -> None:
        assert self.experts is not None
        if self.native and dest is self.tensor:
            return  # the bytes never changed
        dense = self.experts[e] if self.native else self.experts[e].to_dense()
        dest[e].copy_(dense.t() if self.transposed else dense)

    def dense(self) -> torch.Tensor:
        """A new tensor with the original values, shape and strides (the packed bytes stay as they are)."""
        if self.experts is None:
            return self.tensor.detach().clone()
        out = torch.empty_like(self.tensor, requires_grad=False)
        with torch.no_grad():
            for e in range(self.num_experts):
                self._write_back(out, e)
        return out

    def unpack(self) -> torch.Tensor:
        """Write the original bytes back into `tensor`, expert by expert (memory grows by one expert), and return it."""
        if self.experts is not None:
            with torch.no_grad():
                for e in range(len(self.experts)):
                    self._write_back(self.tensor, e)
            self.experts = None
        return self.tensor

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_dense, (self.dense(), self.transposed))


def _from_dense(tensor: torch.Tensor, transposed: bool) -> PackedExperts:
    """Unpickle / deepcopy: pack the dense copy again where this process can, else keep it dense."""
    ok, _ = packing_support(tensor.dtype)
    if ok:
        try:
            return pack_experts(tensor, transposed=transposed)
        except PackingError:
            pass
    holder = PackedExperts(tensor, transposed, 0, [])
    holder.experts = None
    return holder


def pack_experts(weight: torch.Tensor, *, transposed: bool, check_rows: tuple[int, ...] = PROBE_ROWS) -> PackedExperts:
    """Prepare every expert of `weight` in place (see the module docstring); raises PackingError saying why not.
    nn.Linear-style stacks go to the native rows kernel where it is available (nothing reordered), the rest to
    oneDNN's packed layout; either way the memory is then collapsed into 2 MiB pages where Linux allows."""
    if weight.dim() != 3 or weight.device.type != "cpu" or weight.dtype not in SUPPORTED_DTYPES:
        raise PackingError(f"needs a 3-D float32/bfloat16 CPU tensor, got {tuple(weight.shape)} "
                           f"{weight.dtype} on {weight.device.type}")
    if not weight.is_contiguous():
        raise PackingError("the stacked weight is not contiguous")
    if weight.requires_grad:
        raise PackingError("the weight requires grad (packed weights are inference-only)")
    if shares_memory(weight):  # also on the native route: kernelize hides the parameter behind a placeholder
        raise PackingError("its memory is shared with another tensor (a view, a state_dict you hold, a tied "
                           "weight): packing in place would change that tensor")
    if not transposed and native_rows.available(weight.dtype)[0]:
        holder = PackedExperts(weight, transposed, None, [weight[e] for e in range(weight.shape[0])])
    else:
        onednn, why = onednn_support(weight.dtype)
        if not onednn:  # e.g. bfloat16 on an AVX2 CPU: oneDNN would raise part way
            raise PackingError(f"oneDNN cannot pack this {'transposed ' if transposed else ''}stack here: {why}")
        holder = _pack_onednn(weight, transposed=transposed, check_rows=check_rows)
    holder.huge_pages = advise_huge_pages(weight)
    return holder


def _pack_onednn(weight: torch.Tensor, *, transposed: bool, check_rows: tuple[int, ...]) -> PackedExperts:
    """oneDNN's packed layout, expert by expert in place. On any failure part way, the experts already packed are
    written back first: `weight` is never left half packed."""
    api, why = _blob_api()
    if api is None:
        raise PackingError(why)
    with torch.no_grad():
        first = _matrix(weight, 0, transposed)
        hint, why = exact_hint(first, check_rows)
        if hint is None:
            raise PackingError(why)
        slot = weight[0].numel() * weight.element_size()
        experts: list[torch.Tensor] = []
        partial = PackedExperts(weight, transposed, hint, experts)
        try:
            for e in range(weight.shape[0]):
                packed = torch.ops.mkldnn._reorder_linear_weight(_matrix(weight, e, transposed), hint)
                nbytes = torch.ops.mkldnn._nbytes(packed)
                if nbytes != slot:
                    raise PackingError(f"a packed expert takes {nbytes} bytes, the original {slot}: "
                                       "it cannot be packed in place")
                ptr = weight.data_ptr() + e * slot
                view = api.view(ptr, tuple(packed.shape), weight.dtype,
                                torch.ops.mkldnn._get_mkldnn_serialized_md(packed))
                ctypes.memmove(ptr, torch.ops.mkldnn.data_ptr(packed), slot)
                experts.append(view)
                del packed
        except BaseException:
            partial.unpack()
            raise
    return partial


# --- the expert block ---------------------------------------------------------------------------------------------


def moe_experts_packed(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up: PackedExperts,
    down: PackedExperts,
    *,
    gate_up_proj_bias: torch.Tensor | None = None,
    down_proj_bias: torch.Tensor | None = None,
    is_concatenated: bool = True,
    has_gate: bool = True,
    act: Callable[[torch.Tensor], torch.Tensor] = torch.nn.functional.silu,
    gate_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    post_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """torch_api.moe_experts with packed weights (inference only: no autograd), bit-identical to it.

    Same routing, gate and combine as moe_experts, in the same order; each task runs one expert's two projections
    (and its biases, gate) on the grouped loop's workers. post_fn runs on all experts' outputs at once, as there.
    `act` is a function (moe_experts also takes names)."""
    if torch.is_grad_enabled() and (hidden_states.requires_grad or top_k_weights.requires_grad):
        raise RuntimeError("packed expert weights are inference-only: run under torch.no_grad() or "
                           "torch.inference_mode()")
    num_experts = gate_up.num_experts
    num_tokens, top_k = top_k_index.shape
    dtype = gate_up.dtype

    with torch.no_grad():
        sorted_ids, perm, sizes, in_range = route(top_k_index, num_experts)
        rows = perm.numel()
        counts = [int(s) for s in sizes.tolist()]
        items = nonempty_groups(counts, rows)
        covered = items[-1][2] if items else 0
        hidden = down.tensor.shape[2] if down.transposed else down.tensor.shape[1]
        assert gate_up.packed and down.packed, "unpacked"
        gate = functools.partial(activate, act=act, has_gate=has_gate, concatenated=is_concatenated, gate_fn=gate_fn)
        # Every routed row once, in expert order, gathered on a worker (in the caller it would fork OpenMP threads):
        # the projections then take plain slices, which keeps the GIL-holding Python per expert to a minimum.
        x = on_worker(lambda: hidden_states[perm[:covered] // top_k].to(dtype))
        if gate_up.native and down.native:  # the weights lie as they were: the unpacked loop's own products
            parts = [_native_rows_block(x, counts, sorted_ids[:covered], gate_up, down, up_bias=gate_up_proj_bias,
                                        down_bias=down_proj_bias, gate=gate)]
        else:
            parts = _per_expert_parts(x, items, gate_up, down, up_bias=gate_up_proj_bias, down_bias=down_proj_bias,
                                      gate=gate)
        if covered < rows:  # rows of dropped (sentinel) ids
            parts.append(torch.zeros((rows - covered, hidden), dtype=dtype))

        def gathered() -> torch.Tensor:
            if not parts:
                out = torch.zeros((0, hidden), dtype=dtype)
            else:  # a single part is used as it is (no copy)
                out = parts[0] if len(parts) == 1 else torch.cat(parts)  # type: ignore[arg-type]
            return post_fn(out) if post_fn is not None else out

        out = on_worker(gathered) if post_fn is None else gathered()
        return combine_experts(out, top_k_weights, perm, in_range, num_tokens, top_k, hidden_states.dtype)


def _per_expert_parts(x: torch.Tensor, items: list[tuple[int, int, int]], gate_up: PackedExperts,
                      down: PackedExperts, *, up_bias: torch.Tensor | None, down_bias: torch.Tensor | None,
                      gate: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
    """The covered rows' expert outputs, in expert order, one task per expert on the grouped loop's workers (both
    projections, biases and gate in the task): the route for oneDNN-packed weights."""
    dtype = gate_up.dtype
    parts: list[torch.Tensor | None] = [None] * len(items)
    place = {e: i for i, (e, _, _) in enumerate(items)}

    def one(e: int, start: int, end: int) -> None:
        h = gate_up.linear(e, x[start:end])
        if up_bias is not None:
            h = h + up_bias[e]
        h = gate(h)
        o = down.linear(e, h if h.dtype == dtype else h.to(dtype))
        if down_bias is not None:
            o = o + down_bias[e]
        parts[place[e]] = o

    covered = items[-1][2] if items else 0
    run_groups(items, one, covered * (gate_up.tensor[0].numel() + down.tensor[0].numel()))
    return parts  # type: ignore[return-value]


def _native_rows_block(x: torch.Tensor, sizes: list[int], ids: torch.Tensor, gate_up: PackedExperts,
                       down: PackedExperts, *, up_bias: torch.Tensor | None, down_bias: torch.Tensor | None,
                       gate: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The covered rows' expert outputs when both weights stay in their own layout: the two projections are the
    unpacked loop's grouped_matmul on the very same tensors (one native call per worker per projection), the bias and
    gate run once over all rows on a worker, as moe_experts runs them. Equal to moe_experts by construction."""
    dtype = gate_up.dtype

    def middle(h: torch.Tensor) -> torch.Tensor:
        if up_bias is not None:
            h = h + up_bias[ids]
        return gate(h).to(dtype).contiguous()

    up = grouped_matmul(x, gate_up.tensor.transpose(1, 2), sizes)  # in the caller: it spreads over the workers
    h = on_worker(lambda: middle(up))
    out = grouped_matmul(h, down.tensor.transpose(1, 2), sizes)
    return out if down_bias is None else on_worker(lambda: out + down_bias[ids])
