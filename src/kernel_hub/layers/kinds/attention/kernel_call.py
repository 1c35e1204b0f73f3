"""Calling the kernel on one attention call: the planned shifts and head padding applied around the kernel's
`flash_attention`, in eager mode (a Python decision per call) and under torch.compile (no branch on tensor values:
the graph holds the kernel and the previous implementation and keeps one by the plan's check)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ....verify.numerics import relative_error
from .call_plan import AttentionCallPlan, plan_call, plan_kwargs, traced_plan
from .config_switch import previous_function
from .contract import HOOK_ATTR
from .heads import HeadPad, pad_heads, plan_heads
from .segments import gather, scatter


def _roll(x: torch.Tensor, shift: torch.Tensor, sign: int) -> torch.Tensor:
    """x[b, :, i] <- x[b, :, (i + sign*shift[b]) % S] along the sequence axis (dim 2)."""
    s = x.shape[2]
    idx = (torch.arange(s, device=x.device)[None, :] + sign * shift[:, None]) % s
    return x.gather(2, idx[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))


def run_plan(
    flash: Callable[..., torch.Tensor], plan: AttentionCallPlan, query, key, value, *, pad: HeadPad, softcap, sinks
) -> torch.Tensor:
    """The kernel on one call's q/k/v [B,H,S,D] under `plan` and `pad` -> [B,Hq,Sq,Dv]."""
    q, k, v = pad_heads(query, key, value, pad)
    if plan.segments is not None:
        shape = tuple(q.shape)
        q, k, v = (gather(x, plan.segments) for x in (q, k, v))
    elif plan.q_shift is not None:
        q = _roll(q, plan.q_shift, 1)
        k, v = _roll(k, plan.kv_shift, 1), _roll(v, plan.kv_shift, 1)
    out = flash(q, k, v, causal=plan.causal, sm_scale=pad.scale, sliding_window=plan.window,
                logits_soft_cap=softcap, sinks=None if sinks is None else sinks.float(),
                q_lengths=plan.q_lengths, kv_lengths=plan.kv_lengths)
    if plan.segments is not None:
        out = scatter(out, plan.segments, (shape[0], out.shape[1], shape[2], out.shape[3]))
    elif plan.q_shift is not None:
        out = _roll(out, plan.q_shift, -1)  # rows past each q length were 0 and stay 0 (padding rows)
    return out[..., :pad.dv] if pad.v else out


def kernel_call(
    module: torch.nn.Module, flash: Callable[..., torch.Tensor], query, key, value, attention_mask, kwargs
) -> tuple[Any, AttentionCallPlan | None, str]:
    """(output [B,Sq,H,Dv] or None, plan, reason) for one call of the kernel path."""
    why = plan_kwargs(kwargs, training=bool(module.training))
    if why:
        return None, None, why
    pad, why = plan_heads(tuple(query.shape), tuple(key.shape), tuple(value.shape), kwargs.get("scaling"))
    if pad is None:
        return None, None, why
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
    window = kwargs.get("sliding_window")
    if torch.compiler.is_compiling():
        return _traced_kernel_call(module, flash, query, key, value, attention_mask, kwargs, pad=pad,
                                   causal=causal, window=None if window is None else int(window))
    plan, why = plan_call(attention_mask, query.shape[2], key.shape[2], causal=causal,
                          window=None if window is None else int(window))
    if plan is None:
        return None, None, why
    out = run_plan(flash, plan, query, key, value, pad=pad, softcap=kwargs.get("softcap"), sinks=kwargs.get("s_aux"))
    return out.transpose(1, 2).contiguous(), plan, ""


def _traced_kernel_call(module, flash, query, key, value, attention_mask, kwargs, *, pad: HeadPad, causal: bool,
                        window: int | None) -> tuple[Any, AttentionCallPlan | None, str]:
    """kernel_call under torch.compile: no Python branch on tensor values. Where the mask's values decide, the graph
    holds both the kernel and the previous implementation and keeps one by the plan's check (torch.where), so a mask the
    kernel cannot express still gets the previous implementation's output, exactly as in eager mode."""
    plan, ok, why = traced_plan(attention_mask, query.shape[2], key.shape[2], causal=causal, window=window)
    if plan is None:
        return None, None, why
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")

    def kernel(q, k, v):
        out = run_plan(flash, plan, q, k, v, pad=pad, softcap=softcap, sinks=sinks)
        return out.transpose(1, 2).contiguous()

    if ok is None:
        return kernel(query, key, value), plan, ""
    hook = module.__dict__.get(HOOK_ATTR)
    prev_fn = previous_function(module, hook.previous if hook is not None else None)

    def previous(q, k, v):
        return prev_fn(module, q, k, v, attention_mask, **kwargs)[0]

    # torch.where, not torch.cond: torch 2.13's dynamo drops a store to an object attribute made after a torch.cond
    # when the traced frame stored to the same attribute before it. transformers' output capture and kernels'
    # use_kernelized_func set a context variable around every attention layer's forward and reset it after, so
    # under torch.cond the reset was lost: after one compiled call the variable stayed in its compile-time global
    # mode, the next eager forward collected no hidden states, and every compiled call recompiled. Both branches
    # run here (the cost of a mask check under compile) and the check picks one; neither branch mutates anything.
    return torch.where(ok, kernel(query, key, value), previous(query, key, value)), plan, ""


def rel_rows(out: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor | None) -> float:
    """numerics.relative_error over real query rows (out/ref [B,Sq,H,D])."""
    if rows is not None and out.shape == ref.shape:
        out, ref = out[rows], ref[rows]
    return relative_error(out, ref)


