"""The rms_norm kind's validate job: each of the kernel's forms against the layer's current forward on NORM_ROWS random
rows (a private generator; training: the gradients of x and weight too), with the weight held so a kernel that writes
it is undone and refused (layers/layer_check.py's shared rules)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch

from ...layer_check import rel_error
from ...weights_guard import check_output, held_weights
from .plan import FORMS

if TYPE_CHECKING:
    from .contract import RMSNormKernel

NORM_ROWS = 16


def norm_form_errors(module: torch.nn.Module, kernel: RMSNormKernel, eps: float, mode: str, seed: int) -> list[float]:
    """Error of each plan.FORMS entry of the kernel's rms_norm against the module's current forward on random rows
    (training: the max with the gradients of x and weight); a form whose output dtype differs scores inf."""
    weight = cast(torch.Tensor, module.weight)  # find_norms took only modules whose weight is a tensor
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(NORM_ROWS, weight.shape[0], generator=g) * 3.0).to(weight.device, weight.dtype)
    if mode != "training":
        with torch.no_grad():
            ref = module.forward(x)
            with held_weights(module, inputs={"x": x}):  # a kernel that wrote anything but its output is refused
                outs = [kernel.rms_norm(x, weight, eps=eps, zero_centered=zc, scale_after_cast=sac)
                        for zc, sac in FORMS]
        return _form_scores(outs, ref, [rel_error(o, ref) if _fits(o, ref) else math.inf for o in outs])
    cot = torch.randn(NORM_ROWS, weight.shape[0], generator=g).to(weight.device, weight.dtype)

    def run(fn):
        xx = x.clone().requires_grad_(True)
        with torch.enable_grad():
            y = fn(xx)
            grads = torch.autograd.grad((y.float() * cot.float()).sum(), [xx, weight], allow_unused=True)
        return y, grads

    ref, ref_grads = run(module.forward)
    errors, outs = [], []
    for zc, sac in FORMS:
        with held_weights(module):
            out, grads = run(lambda t, zc=zc, sac=sac: kernel.rms_norm(t, weight, eps=eps, zero_centered=zc,
                                                                      scale_after_cast=sac))
        outs.append(out)
        if not _fits(out, ref):
            errors.append(math.inf)
            continue
        errs = [rel_error(out, ref)] + [rel_error(a, b) for a, b in zip(grads, ref_grads, strict=True)]
        errors.append(max(errs))
    return _form_scores(outs, ref, errors)


def _fits(out: object, ref: torch.Tensor) -> bool:
    return isinstance(out, torch.Tensor) and out.dtype == ref.dtype and out.shape == ref.shape


def _form_scores(outs: Sequence[object], ref: torch.Tensor, errors: list[float]) -> list[float]:
    """`errors`, or KernelRefused naming what the kernel returned when no form gives the layer's dtype and shape."""
    if not any(_fits(o, ref) for o in outs):
        check_output(outs[0], ref, "the layer")
    return errors
