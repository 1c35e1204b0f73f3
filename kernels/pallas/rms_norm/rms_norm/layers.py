"""Layer classes in Hugging Face kernels' convention, for `kernels.kernelize` with a LayerRepository pointing here.

HF kernels replaces the `forward` of a module whose class transformers marked `use_kernel_forward_from_hub(NAME)`
with the forward of the class NAME found here, bound to the original module: so a forward reads only the replaced
module's own attributes (`weight`, `variance_epsilon` or `eps`), and the classes carry no constructor and no members
beyond HF kernels' `has_backward` / `can_torch_compile` (it refuses others). Names follow transformers' layer names:
  RMSNorm        weight * x_normed, cast to the input dtype before scaling (Llama, Qwen, Mixtral, ...);
  GemmaRMSNorm   (1 + weight) * x_normed, scaled in float32 (Gemma 1-3);
  RMSNormZeroCentered  the same form under the name transformers 5.25 marks it with (Qwen3.5, Qwen3.5-MoE).
transformers 5.25 still marks "RMSNorm" on its Llama-style norms (133 classes) and "RMSNormZeroCentered" on Qwen3.5's;
GPT-OSS's and Gemma's norms carry no mark (kernel-hub's own kernelize finds them by structure).
The arithmetic is the package's `rms_norm` (this build's dispatch: torch-native on CPU, the Pallas kernel on TPU).
"""

from __future__ import annotations

import importlib

import torch
from torch import nn


def layer_eps(module: nn.Module) -> float:
    """The module's epsilon: transformers stores it as `variance_epsilon` (Llama family) or `eps` (Gemma family)."""
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, int | float):
            return float(value)
    raise AttributeError(f"{type(module).__name__} has neither `variance_epsilon` nor `eps`: not an RMSNorm")


def normalize(module: nn.Module, hidden_states: torch.Tensor, *, zero_centered: bool,
              scale_after_cast: bool) -> torch.Tensor:
    """The package's rms_norm on a module's own weight and epsilon (resolved through the package, so the build's
    one dispatch records the call)."""
    rms_norm = importlib.import_module(__package__).rms_norm
    return rms_norm(hidden_states, module.weight, eps=layer_eps(module), zero_centered=zero_centered,
                    scale_after_cast=scale_after_cast)


class RMSNorm(nn.Module):
    """transformers' "RMSNorm" (LlamaRMSNorm and its copies): weight * x_normed.to(input dtype)."""

    has_backward = True
    can_torch_compile = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return normalize(self, hidden_states, zero_centered=False, scale_after_cast=True)


class GemmaRMSNorm(nn.Module):
    """transformers' Gemma RMSNorm: (1 + weight) * x_normed in float32, cast once."""

    has_backward = True
    can_torch_compile = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return normalize(self, hidden_states, zero_centered=True, scale_after_cast=False)


class RMSNormZeroCentered(nn.Module):
    """transformers 5.25's "RMSNormZeroCentered" (Qwen3_5RMSNorm, Qwen3_5MoeRMSNorm): (1 + weight) * x_normed in
    float32, cast once (GemmaRMSNorm's form)."""

    has_backward = True
    can_torch_compile = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return normalize(self, hidden_states, zero_centered=True, scale_after_cast=False)
