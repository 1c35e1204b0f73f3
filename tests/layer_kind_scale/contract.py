"""The scale kind's name and the Protocol its kernel keeps in its torch entry."""

from __future__ import annotations

from typing import Any, Protocol

NAME = "scale"


class ScaleKernel(Protocol):
    """x[..., H], weight[H] -> x * weight, in x's shape and dtype."""

    def scale_layer(self, x: Any, weight: Any) -> Any:
        ...
