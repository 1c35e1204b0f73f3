"""Back packed expert weights with 2 MiB pages, in place (Linux transparent huge pages, best effort).

Why: a decode step streams every active expert's weights once, gigabytes per layer. With 4 KiB pages that is a TLB
miss every 4 KiB; measured on a 2-core AMD EPYC (Zen 4) VM, one Qwen3-30B-A3B layer at decode 64 ran 10-18% faster
once its packed weights sat in 2 MiB pages. `madvise(MADV_COLLAPSE)` (Linux 6.1+) turns the already-written pages of
a range into huge pages synchronously, one 2 MiB page at a time (memory grows by at most one huge page while it
works); MADV_HUGEPAGE first marks the range so the kernel keeps it that way. Only the 2 MiB-aligned interior of a
tensor's memory is touched; the values never change. Nothing here is needed for correctness: any refusal (another
OS, an old kernel, THP set to "never", no free huge page) leaves the weights as they were and says why.

Imports torch only (the torch-cpu build runs where jax is absent); never imports kernel_hub.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
#: Set to "0" to keep packed weights in ordinary pages (skips the collapse's cost at load time, ~1-2 s per GiB).
ENV = "KERNEL_HUB_CPU_HUGE_PAGES"


def aligned_interior(ptr: int, nbytes: int, page: int = HUGE_PAGE) -> tuple[int, int]:
    """(start, length) of the whole `page`-aligned pages inside [ptr, ptr + nbytes); length 0 when there are none."""
    start = -(-ptr // page) * page
    end = (ptr + nbytes) // page * page
    return (start, end - start) if end > start else (start, 0)


def thp_mode(path: Path = Path("/sys/kernel/mm/transparent_hugepage/enabled")) -> str | None:
    """The bracketed transparent-huge-page mode ("always", "madvise", "never"), or None where there is no such file."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


@functools.cache
def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_huge_pages(tensor: torch.Tensor) -> tuple[int, str]:
    """Collapse the memory under `tensor` into huge pages where the system allows; (bytes now in huge pages, why)."""
    if os.environ.get(ENV, "1") == "0":
        return 0, f"ordinary pages ({ENV}=0)"
    if not sys.platform.startswith("linux"):
        return 0, f"ordinary pages (huge pages are collapsed on Linux only, not {sys.platform})"
    mode = thp_mode()
    if mode in (None, "never"):
        return 0, f"ordinary pages (transparent huge pages are {mode or 'not available'})"
    start, length = aligned_interior(tensor.data_ptr(), tensor.numel() * tensor.element_size())
    if length == 0:
        return 0, "ordinary pages (smaller than one aligned 2 MiB page)"
    madvise = _madvise()
    if madvise(start, length, MADV_HUGEPAGE) != 0:
        return 0, f"ordinary pages (madvise(MADV_HUGEPAGE): {os.strerror(ctypes.get_errno())})"
    if madvise(start, length, MADV_COLLAPSE) != 0:  # new faults get huge pages; written ones stay small
        return 0, f"ordinary pages (madvise(MADV_COLLAPSE): {os.strerror(ctypes.get_errno())})"
    return length, f"{length >> 20} MiB in 2 MiB pages"


def huge_bytes(tensor: torch.Tensor, smaps: Path = Path("/proc/self/smaps")) -> int | None:
    """Bytes of the mappings holding `tensor` that the kernel reports as AnonHugePages (None where unreadable)."""
    lo = tensor.data_ptr()
    hi = lo + tensor.numel() * tensor.element_size()
    try:
        lines = smaps.read_text().splitlines()
    except OSError:
        return None
    total, inside = 0, False
    for line in lines:
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and ":" not in head:
            a, b = (int(x, 16) for x in head.split("-"))
            inside = a < hi and lo < b
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1]) * 1024
    return total
