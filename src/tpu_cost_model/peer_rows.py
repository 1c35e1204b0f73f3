"""The rows every peer table is made of: a peer (a callable and its abstract arguments, or why it was refused),
compiled by libtpu for the generation and read by the cost model, and the best legal configuration of a peer;
shared by peers_worker (ragged dot, attention) and paged_peers (ragged paged attention). Runs in the TPU env.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from kernel_hub.tpu.chips import chip
from kernel_hub.tpu.target import on_device, topology_devices
from kernel_hub.tpu.worker_common import first_meaningful_line

from .schedule import kernel_cost

if TYPE_CHECKING:
    import jax

    from kernel_hub.json_types import JsonDict
    from kernel_hub.tpu.chips import Chip

OURS = "kernel-hub"
#: A peer's argument: a ShapeDtypeStruct stays abstract; a NumPy array (the routing, the lengths) is used as given.
PeerArg: TypeAlias = "jax.ShapeDtypeStruct | np.ndarray"


@dataclass
class Peer:
    name: str
    fn: Callable[..., object] | None  # None: refused before it could be called (`refused` says why)
    args: tuple[PeerArg, ...] = ()  # ShapeDtypeStructs stay abstract; numpy arrays are the routing / lengths
    xla: bool = False  # an XLA op: modeled by XLA's own estimate
    refused: str | None = None
    detail: str = ""
    #: called after the peer is compiled and modeled: what it chose for the chip (blocks), added to `detail`
    chose: Callable[[], str | None] | None = None


def _abstract(args: tuple[PeerArg, ...]) -> tuple[jax.ShapeDtypeStruct, ...]:
    import jax

    return tuple(a if isinstance(a, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype)
                 for a in args)


def _compile(peer: Peer, device: jax.Device) -> tuple[str, jax.stages.Compiled | None]:
    import jax

    try:
        return "yes", jax.jit(peer.fn).lower(*on_device(_abstract(peer.args), device)).compile()
    except Exception as exc:  # the compiler's refusal is the result
        return first_meaningful_line(str(exc) or type(exc).__name__), None


def _modeled(peer: Peer, compiled: jax.stages.Compiled | None, generation: str
             ) -> tuple[float | None, tuple[float, float] | None, str]:
    """(modeled seconds at the constants' points, (fast, slow) at both ends of their bands, how)."""
    if peer.xla:
        if compiled is None:
            return None, None, "not compiled"
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        value = (cost or {}).get("optimal_seconds")
        return (float(value) if value is not None else None), None, "XLA optimal_seconds"
    try:
        cost = kernel_cost(peer.fn, *peer.args, generation=generation)
    except Exception as exc:  # Unmodeled (one line naming the primitive) or the kernel's own refusal at trace
        return None, None, first_meaningful_line(str(exc) or type(exc).__name__)
    c = chip(generation)
    return cost.seconds(c), cost.band(c), f"{len(cost.calls)} call(s), {cost.steps} steps"


def holds_across_band(ours: tuple[float, float, float], peer: tuple[float, float, float]) -> tuple[bool, str]:
    """Whether "ours <= peer" holds at the point and at both ends of the constants' bands (ours and the peer
    evaluated with the same constants at each), and where it first fails."""
    for i, end in ((1, "point"), (0, "fast end"), (2, "slow end")):
        if ours[i] > peer[i]:
            return False, f"not at the {end} of the band"
    return True, "at both ends of the band"


def tpu_target_device(generation: str) -> jax.Device:
    return topology_devices(chip(generation).topology)[0]


@contextlib.contextmanager
def on_chip(peer: Peer, device: jax.Device) -> Iterator[None]:
    """Our kernels pick their blocks and VMEM budget from the device kind the call runs on (never from the host
    tracing it): traced with the mock chip as the default device, ours gets what it would run with on that chip.
    Peers are traced as they come (each reads its chip its own way, explicit blocks where it cannot)."""
    import jax

    if peer.name != OURS:
        yield
        return
    with jax.default_device(device):
        yield


def rows_for(kernel: str, shape: str, peers: list[Peer], ideal: Callable[[Chip], float],
             generation: str) -> list[JsonDict]:
    """One row per peer of one workload on one chip, with the best peer's time beside ours."""
    rows = []
    device = tpu_target_device(generation)
    for peer in peers:
        detail = peer.detail
        if peer.fn is None:
            compiled, modeled, band, how = peer.refused or "refused", None, None, peer.refused or ""
        else:
            with on_chip(peer, device):
                compiled, exe = _compile(peer, device)
                modeled, band, how = _modeled(peer, exe, generation)
            chose = peer.chose() if peer.chose is not None else None
            detail = f"{detail}; {chose}" if chose else detail
        ideal_s = ideal(chip(generation))
        rows.append({"kernel": kernel, "peer": peer.name, "shape": shape, "generation": generation, "xla": peer.xla,
                     "modeled_s": modeled, "band_s": None if band is None else list(band), "ideal_s": ideal_s,
                     "ratio_to_ideal": None if modeled is None else modeled / ideal_s,
                     "compiled": compiled, "how": how, "detail": detail})
    return set_best_peer(rows)


def set_best_peer(rows: list[JsonDict]) -> list[JsonDict]:
    """Sets, on every row of one workload on one chip, the best peer (the fastest kernel that compiled, read by the
    same model) and ours beside it, at the point and across both ends of the band. XLA's optimal_seconds is shown
    beside but not a schedule (it comes out below the ideal of moving each active expert's weights once)."""
    others = [r for r in rows if r["peer"] != OURS and r["modeled_s"] is not None and r["compiled"] == "yes"
              and not r["xla"]]
    best = min(others, key=lambda r: r["modeled_s"], default=None)
    ours = next((r for r in rows if r["peer"] == OURS), None)
    for r in rows:
        r.pop("ours_le_best_why", None)
        r["best_peer"] = None if best is None else best["peer"]
        r["best_peer_s"] = None if best is None else best["modeled_s"]
        r["ours_over_best_peer"] = (None if best is None or ours is None or ours["modeled_s"] is None
                                    else ours["modeled_s"] / best["modeled_s"])
        r["ours_le_best_across_band"] = None
        if best is not None and ours is not None and ours.get("band_s") and best.get("band_s"):
            held, why = holds_across_band((ours["band_s"][0], ours["modeled_s"], ours["band_s"][1]),
                                          (best["band_s"][0], best["modeled_s"], best["band_s"][1]))
            r["ours_le_best_across_band"] = held
            r["ours_le_best_why"] = why
    return rows


def best_legal(name: str, candidates: list[tuple[str, Callable[..., object]]], args: tuple[PeerArg, ...],
               generation: str, *, tries: int = 4) -> Peer:
    """A peer at its best legal configuration: every candidate (label, fn) read by the cost model, then compiled for
    the chip in order of modeled time until one compiles (legal = the compiler takes it). The detail names it."""
    modeled = []
    for label, fn in candidates:
        try:
            modeled.append((kernel_cost(fn, *args, generation=generation).seconds(chip(generation)), label, fn))
        except Exception:  # a configuration the kernel itself refuses at trace
            continue
    modeled.sort(key=lambda t: t[0])
    device = tpu_target_device(generation)
    for _, label, fn in modeled[:tries]:
        if _compile(Peer(name, fn, args), device)[0] == "yes":
            return Peer(name, fn, args, detail=f"{label} (best of {len(modeled)} by the model that compiles)")
    if modeled:  # none compiled: the fastest, whose compile error the row shows
        return Peer(name, modeled[0][2], args, detail=f"{modeled[0][1]} (none of the {tries} fastest compiled)")
    return Peer(name, None, refused="every configuration refused at trace")


def _seconds(peer: Peer, args: tuple[PeerArg, ...], generation: str) -> float:
    """A peer's modeled time; infinity when it has no callable or the model refuses it."""
    if peer.fn is None:
        return math.inf
    try:
        return kernel_cost(peer.fn, *args, generation=generation).seconds(chip(generation))
    except Exception:
        return math.inf
