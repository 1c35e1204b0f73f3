"""A JAX build handed torch tensors says which build to load instead.

Why: `get_kernel` defaults to framework="jax", while HF `kernels` users hold torch tensors. JAX converts many of them
silently (a copy, and a JAX array back) or fails deep inside with a message about JAX types; neither says that the
same repo has a torch build. Each exported function of a JAX build is wrapped once at import to check its arguments
first (top level and one level into tuples, lists and dicts: a few isinstance-free type checks per call).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import ParamSpec, TypeVar

from ..errors import FrameworkMismatchError

P = ParamSpec("P")
R = TypeVar("R")


def is_torch_tensor(value: object) -> bool:
    """A torch.Tensor (or subclass), recognised without importing torch."""
    return any(c.__module__.startswith("torch") and c.__name__ == "Tensor" for c in type(value).__mro__)


def torch_argument(args: tuple[object, ...], kwargs: Mapping[str, object]) -> str | None:
    """Where the first torch tensor among a call's arguments is ("argument 1", "lhs=", ...), or None."""
    for where, value in [*((f"argument {i + 1}", a) for i, a in enumerate(args)),
                         *((f"{k}=", v) for k, v in kwargs.items())]:
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, tuple | list) else ()
        if is_torch_tensor(value) or any(is_torch_tensor(v) for v in inner):
            return where
    return None


def _guarded(fn: Callable[P, R], name: str, label: str, repo_id: str) -> Callable[P, R]:
    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        where = torch_argument(args, kwargs)
        if where is not None:
            raise FrameworkMismatchError(
                f"{label} is a JAX build (get_kernel's default framework='jax') and {name} got a torch.Tensor "
                f"({where}); for torch tensors load the torch build: get_kernel({repo_id!r}, framework='torch')")
        return fn(*args, **kwargs)

    return call


def guard_jax_exports(module: ModuleType, label: str, repo_id: str) -> list[str]:
    """Wrap each plain function `module.__all__` names (a JAX build's public calls); returns their names."""
    wrapped = []
    for name in getattr(module, "__all__", ()):
        fn = getattr(module, name, None)
        if inspect.isfunction(fn):
            setattr(module, name, _guarded(fn, name, label, repo_id))
            wrapped.append(name)
    return wrapped
