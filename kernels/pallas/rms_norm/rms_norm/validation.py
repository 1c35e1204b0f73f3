"""Validation cases: `cases(backend, framework="jax")`, the kernel contract's hook for the kernel-hub harness.

Each case makes fresh random inputs, calls the loaded module's `rms_norm` (forward) or its gradients (backward:
dx and dw concatenated), and computes the NumPy float64 reference (reference.py); the harness owns the verdict.
Edge shapes: rows not a multiple of the row tile, hidden sizes that are not multiples of 128, one row, leading batch
axes, both forms and both cast orders, bf16 and f32. On CPU the "pallas" cases run the kernels interpreted with small
row tiles (several grid steps and a partial last block); a tpu_interpret case runs the TPU simulator with race
detection and NaN-filled fresh memory. framework="torch": the same problems through the torch entry.
`qk_norm_rope` (JAX entry): the seed models' attention fronts (Qwen3's 4 + 1 heads of 128; Gemma 4's global layer:
2 + 1 heads of 512, keys = values, a quarter rotated, values normed), rows past the tile, forward, bf16 and f32.
`attention_front` (JAX entry): the same fronts from a residual stream through the input norm and the projection,
weights stacked over layers at a layer past the first stack block, rows past the tile, bf16 and f32; on CPU also in
the TPU simulator with race detection.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ._vendor.cases import DTYPES, SHORT, Case, tensor
from .reference import (
    reference_attention_front,
    reference_qk_norm_rope,
    reference_rms_norm,
    reference_rms_norm_grads,
)


@dataclasses.dataclass(frozen=True)
class Problem:
    name: str
    shape: tuple[int, ...]
    zero_centered: bool = False
    scale_after_cast: bool = False
    eps: float = 1e-6


def _bf16_round(a: np.ndarray) -> np.ndarray:
    """Round float64 values to bfloat16 (nearest even) and back, in NumPy (no framework)."""
    f = np.asarray(a, np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


@dataclasses.dataclass(frozen=True)
class RMSNormCase(Case):
    problem: Problem = dataclasses.field(default=Problem("x", (4, 128)), repr=False)
    grad: bool = False

    def inputs(self, seed: int) -> dict[str, Any]:
        p, fw = self.problem, self.framework
        rng = np.random.default_rng(seed)
        h = p.shape[-1]
        x = (rng.standard_normal(p.shape) * rng.uniform(0.5, 3.0, p.shape[:-1] + (1,))).astype(np.float32)
        w = (rng.standard_normal(h) * 0.5 + (0.0 if p.zero_centered else 1.0)).astype(np.float32)
        out = {"seed": seed, "x": tensor(x, self.dtype, fw), "weight": tensor(w, self.dtype, fw)}
        if self.grad:
            out["dy"] = tensor(rng.standard_normal(p.shape).astype(np.float32), self.dtype, fw)
        return out

    def _kw(self, module: Any, seed: int) -> dict[str, Any]:
        p = self.problem
        kw = dict(eps=p.eps, zero_centered=p.zero_centered, scale_after_cast=p.scale_after_cast,
                  **self.entry_options(module, seed))
        if self.config and self.framework == "jax":
            kw["config"] = module.RMSNormConfig(**dict(self.config))
        return kw

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        kw = self._kw(module, inputs["seed"])
        x, w = inputs["x"], inputs["weight"]
        if not self.grad:
            return module.rms_norm(x, w, **kw)
        if self.framework == "torch":
            import torch

            xt, wt = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
            module.rms_norm(xt, wt, **kw).backward(inputs["dy"])
            return torch.cat([xt.grad.float().reshape(-1), wt.grad.float().reshape(-1)])
        import jax
        import jax.numpy as jnp

        dy = inputs["dy"]
        f = lambda a, b: jnp.sum(module.rms_norm(a, b, **kw).astype(jnp.float32) * dy.astype(jnp.float32))
        dx, dw = jax.grad(f, argnums=(0, 1))(x, w)
        return jnp.concatenate([dx.astype(jnp.float32).reshape(-1), dw.astype(jnp.float32).reshape(-1)])

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        p = self.problem
        x, w = _f64(inputs["x"]), _f64(inputs["weight"])
        if self.grad:
            dx, dw = reference_rms_norm_grads(x, w, _f64(inputs["dy"]), eps=p.eps, zero_centered=p.zero_centered)
            return np.concatenate([dx.reshape(-1), dw.reshape(-1)])
        rounding = _bf16_round if (p.scale_after_cast and self.dtype == "bfloat16") else None
        return reference_rms_norm(x, w, eps=p.eps, zero_centered=p.zero_centered, round_to=rounding)


@dataclasses.dataclass(frozen=True)
class Front:
    name: str
    tokens: int
    q_heads: int
    kv_heads: int
    head_dim: int
    rotary_dims: int
    values: str = "raw"
    keys_are_values: bool = False


@dataclasses.dataclass(frozen=True)
class QKRopeCase(Case):
    """qk_norm_rope's (q, k, v), flattened and concatenated, against the float64 reference."""

    front: Front = dataclasses.field(default=Front("x", 4, 1, 1, 128, 128), repr=False)

    def inputs(self, seed: int) -> dict[str, Any]:
        f = self.front
        rng = np.random.default_rng(seed)
        heads = f.q_heads + f.kv_heads * (1 if f.keys_are_values else 2)
        qkv = rng.standard_normal((f.tokens, heads * f.head_dim)).astype(np.float32) * 2.0
        w = lambda: (1.0 + 0.3 * rng.standard_normal(f.head_dim)).astype(np.float32)
        return {"seed": seed, "qkv": tensor(qkv, self.dtype, "jax"), "q_weight": tensor(w(), self.dtype, "jax"),
                "k_weight": tensor(w(), self.dtype, "jax"),
                "positions": rng.integers(0, 256, f.tokens).astype(np.int32)}

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        import jax.numpy as jnp

        f = self.front
        cos, sin = module.rope_tables(jnp.asarray(inputs["positions"]), f.head_dim, 1e6, f.rotary_dims)
        kw = dict(q_heads=f.q_heads, kv_heads=f.kv_heads, eps=1e-6, values=f.values,
                  keys_are_values=f.keys_are_values, rotary_dims=f.rotary_dims,
                  **self.entry_options(module, inputs["seed"]))
        if self.config:
            kw["config"] = module.RMSNormConfig(**dict(self.config))
        out = module.qk_norm_rope(inputs["qkv"], inputs["q_weight"], inputs["k_weight"], cos, sin, **kw)
        return jnp.concatenate([o.astype(jnp.float32).reshape(-1) for o in out])

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        f = self.front
        out = reference_qk_norm_rope(_f64(inputs["qkv"]), _f64(inputs["q_weight"]), _f64(inputs["k_weight"]),
                                     inputs["positions"], q_heads=f.q_heads, kv_heads=f.kv_heads, eps=1e-6,
                                     theta=1e6, rotary_dims=f.rotary_dims, values=f.values,
                                     keys_are_values=f.keys_are_values)
        return np.concatenate([o.reshape(-1) for o in out])


_FRONTS_SMALL = (Front("qwen3_rows37", 37, 4, 1, 128, 128),
                 Front("gemma4_global_rows9", 9, 2, 1, 512, 128, "normed", True))
_FRONTS_LARGE = (Front("qwen3_decode64", 64, 4, 1, 128, 128), Front("gemma4_sliding_decode64", 64, 2, 1, 256, 256,
                                                                      "normed"),
                 Front("qwen3_prefill4096", 4096, 4, 1, 128, 128))


@dataclasses.dataclass(frozen=True)
class AttentionFrontCase(Case):
    """attention_front's (q, k, v, x + residual), flattened and concatenated, against the float64 reference; every
    weight stacked over LAYERS, read at LAYER."""

    front: Front = dataclasses.field(default=Front("x", 4, 1, 1, 128, 128), repr=False)
    hidden: int = 256

    LAYERS = 20
    LAYER = 17  # in the stack's second 16-row block

    def inputs(self, seed: int) -> dict[str, Any]:
        f, h, n = self.front, self.hidden, self.LAYERS
        rng = np.random.default_rng(seed)
        heads = f.q_heads + f.kv_heads * (1 if f.keys_are_values else 2)
        arrays = {"x": rng.standard_normal((f.tokens, h)) * 2.0, "residual": rng.standard_normal((f.tokens, h)),
                  "norm_weight": 1.0 + 0.3 * rng.standard_normal((n, h)),
                  "wqkv": rng.standard_normal((n, h, heads * f.head_dim)) / np.sqrt(h),
                  "q_weight": 1.0 + 0.3 * rng.standard_normal((n, f.head_dim)),
                  "k_weight": 1.0 + 0.3 * rng.standard_normal((n, f.head_dim))}
        out = {k: tensor(v.astype(np.float32), self.dtype, "jax") for k, v in arrays.items()}
        return {"seed": seed, **out, "positions": rng.integers(0, 256, f.tokens).astype(np.int32)}

    def call(self, module: Any, inputs: dict[str, Any]) -> Any:
        import jax.numpy as jnp

        f = self.front
        cos, sin = module.rope_tables(jnp.asarray(inputs["positions"]), f.head_dim, 1e6, f.rotary_dims)
        kw = dict(q_heads=f.q_heads, kv_heads=f.kv_heads, eps=1e-6, values=f.values,
                  keys_are_values=f.keys_are_values, rotary_dims=f.rotary_dims, residual=inputs["residual"],
                  layer=self.LAYER, **self.entry_options(module, inputs["seed"]))
        if self.config:
            kw["config"] = module.RMSNormConfig(**dict(self.config))
        out = module.attention_front(inputs["x"], inputs["norm_weight"], inputs["wqkv"], inputs["q_weight"],
                                     inputs["k_weight"], cos, sin, **kw)
        return jnp.concatenate([o.astype(jnp.float32).reshape(-1) for o in out])

    def reference(self, inputs: dict[str, Any]) -> np.ndarray:
        f, i = self.front, self.LAYER
        out = reference_attention_front(
            _f64(inputs["x"]), _f64(inputs["norm_weight"])[i], _f64(inputs["wqkv"])[i], _f64(inputs["q_weight"])[i],
            _f64(inputs["k_weight"])[i], inputs["positions"], q_heads=f.q_heads, kv_heads=f.kv_heads, eps=1e-6,
            theta=1e6, residual=_f64(inputs["residual"]), rotary_dims=f.rotary_dims, values=f.values,
            keys_are_values=f.keys_are_values, round_to=_bf16_round if self.dtype == "bfloat16" else None)
        return np.concatenate([o.reshape(-1) for o in out])


def _attention_front_cases(backend: str) -> list[AttentionFrontCase]:
    """CPU: two fronts at a small hidden size, three row tiles (XLA and the interpreted kernel), and the Qwen3
    front in the TPU simulator with race detection; TPU / GPU: the seed models' fronts at their hidden sizes."""
    name = lambda f, impl, dtype, sim="": f"fwd:front_{f.name}:{impl}{sim}:{SHORT[dtype]}"
    if backend == "cpu":
        out = [AttentionFrontCase(name=name(f, impl, dtype), dtype=dtype, implementation=impl,
                                  tags=("fwd", "front", dtype) + (("interpret",) if impl == "pallas" else ()),
                                  front=f, **({"config": _SMALL_TILES} if impl == "pallas" else {}))
               for f in _FRONTS_SMALL for dtype in DTYPES for impl in ("xla", "pallas")]
        f = _FRONTS_SMALL[0]
        out.append(AttentionFrontCase(name=name(f, "pallas", "float32", ":tpu-interpret"), dtype="float32",
                                      implementation="pallas", tags=("fwd", "front", "tpu_interpret"), front=f,
                                      interpret="tpu", config=_SMALL_TILES))
        return out
    impls = ("pallas", "xla") if backend == "tpu" else ("xla",)
    hidden = {"qwen3": 2048, "gemma4": 2816}
    return [AttentionFrontCase(name=name(f, impl, dtype), dtype=dtype, implementation=impl,
                               tags=("fwd", "front", dtype), front=f, hidden=hidden[f.name.split("_")[0]])
            for f in _FRONTS_LARGE[:2] for dtype in DTYPES for impl in impls]


def _front_cases(backend: str) -> list[QKRopeCase]:
    if backend == "cpu":
        return [QKRopeCase(name=f"fwd:qk_rope_{f.name}:{impl}:{SHORT[dtype]}", dtype=dtype, implementation=impl,
                           tags=("fwd", "qk_rope", dtype) + (("interpret",) if impl == "pallas" else ()),
                           front=f, **({"config": _SMALL_TILES} if impl == "pallas" else {}))
                for f in _FRONTS_SMALL for dtype in DTYPES for impl in ("xla", "pallas")]
    impls = ("pallas", "xla") if backend == "tpu" else ("xla",)
    return [QKRopeCase(name=f"fwd:qk_rope_{f.name}:{impl}:{SHORT[dtype]}", dtype=dtype, implementation=impl,
                       tags=("fwd", "qk_rope", dtype), front=f)
            for f in _FRONTS_LARGE for dtype in DTYPES for impl in impls]


def _f64(a: Any) -> np.ndarray:
    if hasattr(a, "detach"):
        return a.detach().float().numpy().astype(np.float64)
    return np.asarray(a, np.float32).astype(np.float64)


#: Small problems for CPU (interpreted kernels cost per grid step in proportion to operand bytes).
_SMALL = (
    Problem("rows37_h256", (37, 256)),  # rows not a multiple of the 16-row tile
    Problem("rows40_h200_zero_centered", (40, 200), zero_centered=True),  # hidden not a multiple of 128
    Problem("batch2x9_h384_llama_order", (2, 9, 384), scale_after_cast=True, eps=1e-5),  # leading axes
    Problem("one_row_h2112", (1, 2112)),  # Gemma 4's hidden size, one decode row
)

#: Chip-sized problems for real TPUs and GPUs: the seed models' hidden sizes at decode and prefill.
_LARGE = (
    Problem("decode64_h2048_llama_order", (64, 2048), scale_after_cast=True),
    Problem("decode64_h2112", (64, 2112)),
    Problem("prefill4096_h2880", (4096, 2880), eps=1e-5),
    Problem("prefill1000_h4096_zero_centered", (1000, 4096), zero_centered=True),
)

_SMALL_TILES = (("block_rows", 16),)


def _case(p: Problem, dtype: str, impl: str | None, *tags: str, grad: bool = False, **kw: Any) -> RMSNormCase:
    tpu = ":tpu-interpret" if kw.get("interpret") == "tpu" else ""
    name = f"{'bwd' if grad else 'fwd'}:{p.name}:{impl or 'default'}{tpu}:{SHORT[dtype]}"
    return RMSNormCase(name=name, dtype=dtype, implementation=impl, tags=("bwd" if grad else "fwd", *tags),
                       problem=p, grad=grad, **kw)


def _torch_cases() -> list[RMSNormCase]:
    return [_case(p, dtype, None, "torch", dtype, grad=grad, framework="torch")
            for p in _SMALL for dtype in DTYPES for grad in (False, True)]


def cases(backend: str, framework: str = "jax") -> list[RMSNormCase | QKRopeCase | AttentionFrontCase]:
    """Every problem x implementation for this backend, forward and backward, in f32 and bf16; the attention
    fronts' forward, qk_norm_rope's and attention_front's (JAX entries)."""
    if framework == "torch":
        return [dataclasses.replace(c, name=f"torch:{c.name}") for c in _torch_cases()]
    backend = backend.lower()
    out: list[RMSNormCase | QKRopeCase | AttentionFrontCase] = [*_front_cases(backend),
                                                                *_attention_front_cases(backend)]
    if backend == "cpu":
        for p in _SMALL:
            for dtype in DTYPES:
                for grad in (False, True):
                    out.append(_case(p, dtype, "xla", dtype, grad=grad))
                    out.append(_case(p, dtype, "pallas", "interpret", dtype, grad=grad, config=_SMALL_TILES))
            out.append(_case(p, "float32", "autodiff", "oracle", grad=True))
        out.append(_case(_SMALL[0], "float32", "pallas", "tpu_interpret", grad=True, interpret="tpu",
                         config=_SMALL_TILES))
        return out
    impls = ("pallas", "xla") if backend == "tpu" else ("xla",)
    for p in _LARGE:
        for impl in impls:
            for dtype in DTYPES:
                for grad in (False, True):
                    out.append(_case(p, dtype, impl, dtype, grad=grad))
    return out
