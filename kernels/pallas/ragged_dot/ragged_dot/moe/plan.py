"""Decisions of an expert-parallel MoE layer, as pure functions of its sizes: which dispatch scheme moves the fewest
bytes between devices, and how many rows each device runs through the ragged dots. Each returns its reason.

Schemes (experts split over an expert axis of `e` devices, optionally I split over a tensor axis of `t`):
  "psum"        tokens replicated on every device; each device runs the rows routed to its own experts and the
                partial outputs are summed with one all-reduce (psum) of [T, H] over the expert (and tensor) axes.
  "all_gather"  tokens sharded over the expert axis; an all-gather of [T, H] in, the same local work, a
                reduce-scatter of [T, H] out (plus a psum over the tensor axis). An all-reduce is a reduce-scatter
                plus an all-gather, so it moves the same bytes as "psum", in two collectives instead of one.
  "all_to_all"  tokens sharded over the expert axis; each (token, slot) row goes to the device of its expert in a
                fixed-size buffer of C rows per destination, and comes back the same way. Static shapes need C; with
                no capacity factor C is every row a device holds (T/e * k: nothing is ever dropped), which sends e
                times the rows a uniform routing needs.
Bytes are what one device sends over the interconnect in one forward pass, by the textbook algorithms: all-reduce
2(n-1)/n x S, all-gather and reduce-scatter (n-1)/n x S (S the full [T, H] array), all-to-all (n-1)/n x its buffer.

Pure Python, no jax: kernel-hub's TPU cost model and the benches read the same numbers.
"""

from __future__ import annotations

import dataclasses
import math

SCHEMES: tuple[str, ...] = ("psum", "all_gather", "all_to_all")
#: Collectives each scheme issues per forward (ties in bytes go to fewer collectives: each costs latency).
COLLECTIVES = {"psum": 1, "all_gather": 2, "all_to_all": 2}


@dataclasses.dataclass(frozen=True)
class MoeSizes:
    """One MoE layer call on a mesh: T tokens of width H, top-k of E experts, experts over `expert_devices`,
    the expert intermediate over `tensor_devices`, activations of `itemsize` bytes."""

    tokens: int
    hidden: int
    top_k: int
    experts: int
    expert_devices: int
    tensor_devices: int = 1
    itemsize: int = 2

    def __post_init__(self) -> None:
        for name in ("tokens", "hidden", "top_k", "experts", "expert_devices", "tensor_devices", "itemsize"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoeSizes.{name} must be >= 1, got {getattr(self, name)}")
        if self.experts % self.expert_devices:
            raise ValueError(f"{self.experts} experts do not split evenly over {self.expert_devices} devices")

    @property
    def local_tokens(self) -> int:
        """Tokens per device when tokens are sharded over the expert axis (padded up to a multiple of it)."""
        return -(-self.tokens // self.expert_devices)

    @property
    def token_bytes(self) -> int:
        """Bytes of one [T, H] activation (T padded to the expert axis where tokens are sharded)."""
        return self.tokens * self.hidden * self.itemsize


def _ring(n: int, payload: float, factor: float) -> float:
    return 0.0 if n <= 1 else factor * (n - 1) / n * payload


def collectives(scheme: str, sizes: MoeSizes, capacity_factor: float | None = None) -> list[tuple[str, int, float]]:
    """(kind, devices in the group, bytes each device sends) of every collective `scheme` issues per forward."""
    e, t = sizes.expert_devices, sizes.tensor_devices
    full = sizes.token_bytes
    if scheme == "psum":
        return [("all_reduce", e * t, _ring(e * t, full, 2))]
    padded = sizes.local_tokens * e * sizes.hidden * sizes.itemsize
    if scheme == "all_gather":
        out = [("all_gather", e, _ring(e, padded, 1)), ("reduce_scatter", e, _ring(e, padded, 1))]
        if t > 1:
            out.append(("all_reduce", t, _ring(t, padded / e, 2)))
        return out
    if scheme == "all_to_all":
        cap = rows_per_device("all_to_all", sizes, capacity_factor)[0] // e
        buffer = e * cap * sizes.hidden * sizes.itemsize
        out = [("all_to_all", e, _ring(e, buffer, 1)), ("all_to_all", e, _ring(e, buffer, 1))]
        if t > 1:
            out.append(("all_reduce", t, _ring(t, sizes.local_tokens * sizes.hidden * sizes.itemsize, 2)))
        return out
    raise ValueError(f"unknown dispatch scheme {scheme!r}; known: {', '.join(SCHEMES)}")


def collective_bytes(scheme: str, sizes: MoeSizes, capacity_factor: float | None = None) -> int:
    """Bytes one device sends over the interconnect per forward under `scheme`."""
    return round(sum(b for _, _, b in collectives(scheme, sizes, capacity_factor)))


def _round8(n: float) -> int:
    return max(8, 8 * math.ceil(n / 8))


def rows_per_device(scheme: str, sizes: MoeSizes, capacity_factor: float | None = None) -> tuple[int, str]:
    """(rows each device runs through its ragged dots, why).

    No capacity factor: exact. "psum"/"all_gather" run every (token, slot) row of the batch (T x k, the most one
    device can receive: one expert may hold them all), rows routed elsewhere sort last and cost the kernel no weight
    reads. "all_to_all" keeps C = (T/e) x k rows per destination, so nothing is dropped. With a capacity factor
    cf, a device keeps cf x its fair share (T x k / e, rounded up to 8) and rows past it are dropped (their outputs
    are zero), the usual trade of exactness for memory and work under skewed routing."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown dispatch scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    if capacity_factor is not None and capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be positive, got {capacity_factor}")
    e, k = sizes.expert_devices, sizes.top_k
    if scheme == "all_to_all":
        own = sizes.local_tokens * k  # rows this device holds; all may go to one destination
        if capacity_factor is None:
            return e * own, f"exact: {own} rows per destination x {e} sources (nothing dropped)"
        cap = min(own, _round8(capacity_factor * own / e))
        return e * cap, (f"capacity {capacity_factor:g} x fair share {own}/{e}: {cap} rows per destination "
                         f"x {e} sources; rows past it are dropped")
    total = (sizes.local_tokens * e if scheme == "all_gather" else sizes.tokens) * k
    if capacity_factor is None or e == 1:
        return total, f"exact: all {total} (token, slot) rows, routed-elsewhere rows sorted last (nothing dropped)"
    rows = min(total, _round8(capacity_factor * total / e))
    return rows, f"capacity {capacity_factor:g} x fair share {total}/{e}: {rows} rows; rows past it are dropped"


def choose_scheme(sizes: MoeSizes, capacity_factor: float | None = None,
                  allowed: tuple[str, ...] = SCHEMES) -> tuple[str, str]:
    """(scheme, why): the fewest bytes sent per device; ties go to the scheme with fewer collectives."""
    if not allowed:
        raise ValueError("no dispatch scheme allowed")
    if sizes.expert_devices * sizes.tensor_devices == 1:
        return "psum", "one device: nothing moves (psum over one device is free)"
    cost = {s: collective_bytes(s, sizes, capacity_factor) for s in allowed}
    best = min(allowed, key=lambda s: (cost[s], COLLECTIVES[s], SCHEMES.index(s)))
    listed = ", ".join(f"{s} {cost[s] / 2**10:.0f} KiB" for s in allowed)
    return best, (f"{best}: fewest bytes sent per device at T={sizes.tokens}, H={sizes.hidden}, k={sizes.top_k}, "
                  f"{sizes.expert_devices}x{sizes.tensor_devices} devices ({listed}; ties: fewer collectives)")
