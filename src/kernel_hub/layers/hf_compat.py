"""HF `kernels` conventions read as kernelize's own: `Mode` flags for `mode=`, HF layer names as mapping keys,
`LayerRepository` / `LocalLayerRepository` (alone, per device, per mode) as mapping values, `use_fallback=`.

Why its own module: users bring these from HF `kernels` and transformers; translating them here, before the plan,
keeps the rest of kernelize on one vocabulary. Everything is read by duck type (class names and the attributes HF
`kernels` 0.19 keeps), so `kernels` is never imported. Each decision returns its answer with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import KernelHubError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .kinds.declaration import LayerKind

_MODES = {"INFERENCE": "inference", "TRAINING": "training"}


@dataclass(frozen=True)
class LocalSpec:
    """A mapping value naming a kernel source folder on this machine (HF's LocalLayerRepository)."""

    path: Path

    def __str__(self) -> str:
        return str(self.path)


def _flag_names(mode: Any) -> set[str] | None:
    """The member names set in an HF `kernels.Mode` flag (None: `mode` is not one)."""
    cls = type(mode)
    if cls.__name__ != "Mode" or not cls.__module__.startswith("kernels"):
        return None
    return {m.name for m in cls if m.value and (m.value & mode.value) == m.value}


def mode_name(mode: Any) -> tuple[str | None, str]:
    """("inference" | "training", why) for kernelize's `mode=`, a string or an HF `Mode` flag; (None, why not)."""
    if isinstance(mode, str):
        return (mode, "") if mode in _MODES.values() else (None, f"mode must be one of inference, training (or "
                                                                  f"kernels.Mode.INFERENCE / TRAINING), got {mode!r}")
    names = _flag_names(mode)
    if names is None:
        return None, ("mode must be one of inference, training (or kernels.Mode.INFERENCE / TRAINING), got "
                      f"{type(mode).__name__}")
    if "TORCH_COMPILE" in names:
        return None, ("Mode.TORCH_COMPILE: kernel-hub's kernelize does not check its layers under torch.compile; "
                      "pass Mode.INFERENCE or Mode.TRAINING (or 'inference' / 'training')")
    if names == {"FALLBACK"}:
        return None, "Mode.FALLBACK marks a mapping entry, not a kernelize mode: pass Mode.INFERENCE or Mode.TRAINING"
    if len(names) != 1 or next(iter(names)) not in _MODES:
        return None, f"mode {mode} is not one of Mode.INFERENCE, Mode.TRAINING"
    return _MODES[next(iter(names))], f"kernels.Mode.{next(iter(names))}"


def check_mode_arg(mode: Any) -> str:
    name, why = mode_name(mode)
    if name is None:
        raise KernelHubError(why)
    return name


def kind_for_key(key: Any, kinds: Sequence[LayerKind]) -> tuple[str | None, str]:
    """(kernelize's kind, why) for a mapping key: a kind's own name or an HF layer name one of `kinds` declares as
    meaning the same layer (its `hf_names` / `hf_pattern`)."""
    if not isinstance(key, str):
        return None, f"mapping keys are layer kinds or HF layer names, got {type(key).__name__}"
    if key in (k.name for k in kinds):
        return key, ""
    kind = next((k.name for k in kinds if k.is_hf_name(key)), None)
    if kind is not None:
        return kind, f"HF layer name {key!r} is kernelize's {kind}"
    hf = [n for k in kinds for n in (*k.hf_names, *((k.hf_pattern[1],) if k.hf_pattern else ()))]
    known = ", ".join((*(k.name for k in kinds), *hf))
    return None, f"unknown layer kind {key!r} in mapping; kernelize knows: {known}"


def strict_from(strict: bool, use_fallback: Any) -> bool:
    """kernelize's strictness from `strict=` and HF's `use_fallback=` (False or KernelizeFallback.NONE: strict).
    Every other fallback setting keeps layers, as kernel-hub always does (each with its reason in the report)."""
    if use_fallback is None:
        return bool(strict)
    value = getattr(use_fallback, "value", use_fallback)
    if not isinstance(value, bool | int):
        raise KernelHubError(f"use_fallback must be True/False or kernels.KernelizeFallback, got {use_fallback!r}")
    fallback = bool(value)
    if strict and fallback:
        raise KernelHubError("strict=True and use_fallback allowing fallback contradict each other: drop one")
    return strict or not fallback


def explicit_skips(mapping: dict[Any, Any] | None, kinds: Sequence[LayerKind]) -> frozenset[str]:
    """The kinds a mapping leaves alone on purpose (value None); keys that name no kind are refused later."""
    return frozenset(kind for key, value in (mapping or {}).items() if value is None
                     for kind in [kind_for_key(key, kinds)[0]] if kind is not None)


def _repo_of(value: Any) -> dict[str, Any] | LocalSpec | None:
    """A LayerRepository / LocalLayerRepository as a repo dict / LocalSpec (None: it is neither)."""
    name = type(value).__name__
    if not type(value).__module__.startswith("kernels"):
        return None
    if name == "LayerRepository":
        repo = {"repo_id": getattr(value, "_repo_id", None), "version": getattr(value, "_version", None),
                "revision": getattr(value, "_revision", None)}
        trust = getattr(value, "_trust_remote_code", False)
        return {**repo, "trust_remote_code": trust} if trust else repo
    if name == "LocalLayerRepository":
        return LocalSpec(Path(value._repo_path))
    if name == "LockedLayerRepository":
        raise KernelHubError("a LockedLayerRepository pins through HF kernels' lock; in kernelize's mapping name the "
                             "repo (LayerRepository or 'org/name') and lock it with kernel-hub lock")
    return None


def _device(key: Any) -> Any:
    """A per-device key: a string, or HF's Device(type=...) read as its type."""
    return key if isinstance(key, str) else getattr(key, "type", key)


def _for_mode(value: dict[Any, Any], mode: str) -> tuple[Any, str]:
    """The entry of an HF {Mode: repo} dict for kernelize's mode: that mode alone, then that mode with
    TORCH_COMPILE (a kernel fit for compile runs without it), then FALLBACK; (None, why) when none fits."""
    by_names = {frozenset(_flag_names(k) or ()): v for k, v in value.items()}
    want = mode.upper()
    for names in (frozenset({want}), frozenset({want, "TORCH_COMPILE"}), frozenset({"FALLBACK"})):
        if names in by_names:
            return by_names[names], ""
    given = ", ".join("|".join(sorted(n)) for n in by_names)
    return None, f"no entry for Mode.{want} (given: {given})"


def _is_mode_dict(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(_flag_names(k) is not None for k in value)


def hf_value(value: Any, backend: str, mode: str) -> tuple[Any, str]:
    """A mapping value in kernelize's forms (repo id, repo dict, LocalSpec, loaded kernel, None) with why, reading
    HF's LayerRepository / LocalLayerRepository and its {device: ...} and {Mode: ...} nesting."""
    why = ""
    if isinstance(value, dict) and value and not any(isinstance(k, str) and k in ("repo_id", "version", "revision",
                                                                                  "trust_remote_code") for k in value):
        if _is_mode_dict(value):
            value, why = _for_mode(value, mode)
        else:
            by_device = {_device(k): v for k, v in value.items()}
            if backend not in by_device:
                return None, f"no entry for {backend} (given: {', '.join(map(str, by_device))})"
            value = by_device[backend]
            if _is_mode_dict(value):
                value, why = _for_mode(value, mode)
    repo = _repo_of(value)
    return (repo if repo is not None else value), why


def normalize_mapping(mapping: dict[Any, Any] | None, kinds: Sequence[LayerKind], backend: str,
                      mode: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(mapping with kernelize's kinds as keys and its value forms, {kind: why nothing fits this backend/mode}).

    Two keys naming one kind (e.g. "RMSNorm" and "rms_norm") are refused, as is any key that names no kind."""
    out: dict[str, Any] = {}
    unfit: dict[str, str] = {}
    seen: dict[str, Any] = {}
    for key, value in (mapping or {}).items():
        kind, why = kind_for_key(key, kinds)
        if kind is None:
            raise KernelHubError(why)
        if kind in seen:
            raise KernelHubError(f"mapping keys {seen[kind]!r} and {key!r} both name the layer kind {kind}: keep one")
        seen[kind] = key
        out[kind], why = hf_value(value, backend, mode)
        if out[kind] is None and value is not None:
            unfit[kind] = f"mapping[{key!r}]: {why}"
    return out, unfit
