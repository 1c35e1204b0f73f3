"""What a long-lived test worker releases between modules: JAX's compiled programs.

Each program XLA's CPU backend compiles keeps its code mapped until JAX's caches drop it. A worker that runs module
after module of interpreted Pallas kernels maps ~11,000 regions a module (flash_attention's test_paged_store.py), and
Linux allows a process 65,530 (vm.max_map_count): the mapping that fails then leaves jaxlib calling a null pointer,
a segmentation fault inside the next compile. Dropping the caches at each module's end keeps a worker near its
starting count; a module recompiles only what it uses.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path


def mapped_regions() -> int | None:
    """This process's memory mappings (Linux /proc), None where it has no such file."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    with maps.open() as lines:
        return sum(1 for _ in lines)


def release() -> None:
    """Drop JAX's compiled programs (when JAX is loaded) and collect what held them."""
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
    gc.collect()
