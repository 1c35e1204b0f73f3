"""`kernel-hub serve`: the Hub HTTP API subset that huggingface_hub and HF `kernels` use, over a store of
bare git repositories (written with dulwich), served by uvicorn on loopback by default."""

from __future__ import annotations

from .app import build_app, serve
from .errors import HubError, StoreError
from .gitstore import GitStore
from .transport import Limits

__all__ = ["GitStore", "HubError", "Limits", "StoreError", "build_app", "serve"]
