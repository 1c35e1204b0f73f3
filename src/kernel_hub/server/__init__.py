"""`kernel-hub serve`: the Hub HTTP API subset that huggingface_hub and HF `kernels` use, over a store of
bare git repositories, served by uvicorn on loopback by default."""

from __future__ import annotations

from .app import build_app, serve
from .gitstore import GitStore, StoreError

__all__ = ["GitStore", "StoreError", "build_app", "serve"]
