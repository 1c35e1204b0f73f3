"""Kernel-builder variant names (the Hub's own build tool): parse, judge on a system, order by preference.

Pure: no I/O, the system is an argument. The names and the order follow what HF `kernels` 0.19.1 reads:
- noarch `torch-<backend>` (`torch-cpu`, `torch-tpu`, `torch-universal`): Python only, any torch;
- arch `torch-<X.Y>[-cxx11|-cxx98]-<backend>[-<version>]-cpython-<X.Y>-<abi3|abi3t>-<cpu>-<os>`;
- legacy arch `torch<X><Y>[-cxx11|-cxx98]-<backend><version>-<cpu>-<os>` (implicitly cpython 3.9, abi3).
Arch builds come before noarch ones; among arch builds an untagged C++ ABI before a tagged one, a newer backend
version first, abi3 before abi3t, a newer minimum Python first; among noarch ones the system's backend before
`universal`. kernel-hub runs Python source only, so an arch build loads only where it ships no native code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .system import SystemFacts

UNIVERSAL = "universal"
_NEW_TORCH = re.compile(r"^torch-(\d+)\.(\d+)$")
_LEGACY_TORCH = re.compile(r"^torch(\d)(\d+)$")
_PY = re.compile(r"^(\d+)\.(\d+)$")
_DOTTED = re.compile(r"^(\d+)\.(\d+)$")
#: legacy backends carry their version glued on, the last digit the minor: cu128 (12.8), rocm63, xpu20251 (2025.1);
#: rocm714 is ROCm 7.14
_LEGACY_BACKEND = re.compile(r"^(cu|rocm|xpu|cann)(\d+)(\d)$")
_VERSIONED = {"cuda", "rocm", "xpu", "cann"}
_PLAIN = {"cpu", "tpu", "metal", "neuron"}
_ABIS = ("abi3", "abi3t")
_WORD = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class BuilderName:
    """One kernel-builder variant name, read."""

    name: str
    kind: str                                 # "noarch" | "arch" | "legacy-arch"
    backend: str                              # "cpu", "tpu", "cuda", ..., "universal"
    backend_version: tuple[int, int] | None = None
    torch: tuple[int, int] | None = None      # arch builds: the torch major.minor they were built against
    cxx11: bool | None = None                 # arch builds: the C++ ABI tag (None: untagged)
    python: tuple[int, int] = (3, 9)          # the minimum CPython of compiled parts
    abi: str = "abi3"
    cpu: str | None = None
    os: str | None = None


def _backend(parts: list[str], legacy: bool) -> tuple[str, tuple[int, int] | None] | None:
    if legacy:
        if len(parts) != 1:
            return None
        if parts[0] in _PLAIN:
            return parts[0], None
        if parts[0] == "rocm714":
            return "rocm", (7, 14)
        m = _LEGACY_BACKEND.fullmatch(parts[0])
        if not m:
            return None
        return {"cu": "cuda"}.get(m.group(1), m.group(1)), (int(m.group(2)), int(m.group(3)))
    if len(parts) == 1 and parts[0] in _PLAIN:
        return parts[0], None
    if len(parts) == 2 and parts[0] in _VERSIONED and (m := _DOTTED.fullmatch(parts[1])):
        return parts[0], (int(m.group(1)), int(m.group(2)))
    return None


def parse_builder_name(name: str) -> BuilderName | None:
    """The variant a kernel-builder folder name describes, or None for a name outside both torch schemes."""
    parts = name.split("-")
    if len(parts) == 2 and parts[0] == "torch" and _WORD.fullmatch(parts[1]):
        return BuilderName(name, "noarch", parts[1])
    if len(parts) >= 2 and parts[0] == "torch" and (m := _DOTTED.fullmatch(parts[1])):
        legacy, torch, rest = False, (int(m.group(1)), int(m.group(2))), parts[2:]
    elif m := _LEGACY_TORCH.fullmatch(parts[0]):
        legacy, torch, rest = True, (int(m.group(1)), int(m.group(2))), parts[1:]
    else:
        return None
    cxx11 = None
    if rest[:1] in (["cxx11"], ["cxx98"]):
        cxx11, rest = rest[0] == "cxx11", rest[1:]
    if len(rest) < 3:
        return None
    cpu, os_name, rest = rest[-2], rest[-1], rest[:-2]
    python, abi = (3, 9), "abi3"
    if not legacy:
        if "cpython" not in rest:
            return None
        i = rest.index("cpython")
        tail, rest = rest[i:], rest[:i]
        if len(tail) != 3 or not (pm := _PY.fullmatch(tail[1])) or tail[2] not in _ABIS:
            return None
        python, abi = (int(pm.group(1)), int(pm.group(2))), tail[2]
    backend = _backend(rest, legacy)
    if backend is None or not _WORD.fullmatch(cpu) or not _WORD.fullmatch(os_name):
        return None
    return BuilderName(name, "legacy-arch" if legacy else "arch", backend[0], backend[1], torch, cxx11, python, abi,
                       cpu, os_name)


def _ver(v: tuple[int, int] | None) -> str:
    return "-" if v is None else f"{v[0]}.{v[1]}"


def _major_minor(version: str | None) -> tuple[int, int] | None:
    m = re.match(r"^(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def judge_builder(b: BuilderName, system: SystemFacts, framework: str) -> tuple[bool, str]:
    """(accepted, reason) for one kernel-builder variant on `system`, asked for tensors of `framework`."""
    if framework != "torch":
        return False, f"a torch build (kernel-builder), asked for {framework}"
    if b.kind == "noarch":
        if b.backend not in (system.backend, UNIVERSAL):
            return False, f"noarch backend {b.backend}, this system is {system.backend} (not universal either)"
        return True, f"noarch torch on {system.backend}" + (" (universal)" if b.backend == UNIVERSAL else "")
    have_py = _major_minor(system.python_version)
    if have_py is not None and have_py < b.python:
        return False, f"needs CPython >= {_ver(b.python)}, have {system.python_version}"
    if b.abi == "abi3t":
        return False, "abi3t (free-threaded CPython >= 3.15), this Python has a GIL"
    if b.cpu != system.machine:
        return False, f"CPU {b.cpu}, this system is {system.machine}"
    if b.os != system.os_name:
        return False, f"OS {b.os}, this system is {system.os_name}"
    torch = _major_minor(system.torch_version)
    if b.torch != torch:
        return False, f"built for torch {_ver(b.torch)}, have {system.torch_version or 'no torch'}"
    if b.cxx11 is not None and system.torch_cxx11_abi is not None and b.cxx11 != system.torch_cxx11_abi:
        tag = "cxx11" if b.cxx11 else "cxx98"
        return False, f"C++ ABI {tag}, this torch is {'cxx11' if system.torch_cxx11_abi else 'cxx98'}"
    if b.backend != system.backend:
        return False, f"backend {b.backend}{' ' + _ver(b.backend_version) if b.backend_version else ''}, " \
                      f"this system is {system.backend}"
    abi_note = "" if b.cxx11 is None or system.torch_cxx11_abi is not None else ", C++ ABI not checked (torch " \
        "not imported)"
    return True, f"{b.kind} torch {_ver(b.torch)} on {system.backend}, cpython>={_ver(b.python)} {b.abi}{abi_note}"


def preference(b: BuilderName) -> tuple[int, ...]:
    """Sort key, best first: arch before noarch, as HF kernels 0.19.1 orders them."""
    if b.kind == "noarch":
        return (1, 1 if b.backend == UNIVERSAL else 0, 0, 0, 0, 0)
    return (0, 0 if b.cxx11 is None else 1, -(b.backend_version or (0, 0))[1], _ABIS.index(b.abi), -b.python[0],
            -b.python[1])
