"""Layer kinds: one folder per kind, each declaring `KIND = LayerKind(...)` (declaration.py), and the one list of the
built-in kinds, `BUILTIN_KINDS`.

A kind's folder holds everything about it: where kernelize finds the layer in a model, the decisions, the inputs its
layers are validated on, the flow that swaps and restores them, its transformers / Diffusers adapters where it has
them, and its declaration (the Protocols its kernel keeps, its report title). The generic jobs below (layers/find,
plan, load, validate, swap, report, weights_guard) know no kind: layers/api.py hands the kinds down to them, as an
argument. Built in: experts/ (moe_experts), attention/, rms_norm/.

What a kind needs (tests/layers/test_layer_kind_toy.py declares a toy kind from a folder outside this package with
exactly these, and holds this list to what it needed):

- one folder (a package) of its own, anywhere importable, whose `__init__.py` declares `KIND = LayerKind(...)` with
  - `name`: the kind's name in mapping=, registry.yaml `layers`, kernel.yaml `replaces` and the report's rows
  - `title`: how the report's family table titles the kind's column
  - `export`: the function a kernel must export to serve it
  - `protocols`: the Protocols a serving kernel's torch entry keeps (`layer_kernel_problems` checks a kernel)
  - `finds`: prose, where kernelize finds such layers in a model
  - `contract`: prose, the call the kernel is held to
  - `validated_on`: prose, the inputs each layer is checked on before the swap
  - `apply`: fn(KindRun): finds the layers, loads the kernel (layers/load.kernel_for), validates each layer, swaps
    it and appends report rows, recording in the run's state what restore needs
  - `restore`: fn(model, state): puts back exactly what `apply` changed
  - `order`: where it runs among the kinds (increasing; restore runs in reverse)
  and, where it has them, `optional` (Protocols kept all or none), `diffusers` (how it runs on a Diffusers denoiser),
  `accepts` (a kind served through more than one convention), `hf_names` and `hf_pattern` (HF layer names that mean
  the kind in mapping=) and `quantizes` (its check of kernelize's quantize=);
- the serving kernel's kernel.yaml `replaces: [<name>]` (and, for a default kernel, its registry.yaml `layers`
  entry).

A built-in kind is listed once, in `BUILTIN_KINDS` below; any other kind is used by handing it to kernelize:
`kh.kernelize(model, kinds=(*BUILTIN_KINDS, MY_KIND), mapping={"my_kind": kernel})` (restore then runs its restore
too; `mapping=` names any kernel for it, a repo id or a loaded module). Importing this package imports neither torch
nor jax: each declaration imports its contract (and the experts' framework-free plan), and its flow only when it runs.
"""

from __future__ import annotations

from typing import Any

from ...verify.contract import protocol_problems
from . import attention, experts, rms_norm
from .declaration import KindRun, LayerKind, in_order

#: The layer kinds kernelize runs unless told otherwise (kernelize(kinds=...)), in apply order.
BUILTIN_KINDS: tuple[LayerKind, ...] = in_order((experts.KIND, attention.KIND, rms_norm.KIND))

__all__ = ["BUILTIN_KINDS", "KindRun", "LayerKind", "in_order", "layer_kernel_problems"]


def layer_kernel_problems(module: Any, kind: str, kinds: tuple[LayerKind, ...] = BUILTIN_KINDS) -> list[str]:
    """Every way the torch entry `module` falls short of serving the layer kind named `kind` (one of `kinds`): its
    declaration's Protocols, entry by entry (contract.protocol_problems); empty: it keeps the contract."""
    declared = {k.name: k for k in kinds}
    if kind not in declared:
        return [f"{kind}: no such layer kind (known: {', '.join(declared)})"]
    return protocol_problems(module, kind, declared[kind].protocols, declared[kind].optional)
