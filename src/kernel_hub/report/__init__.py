"""The validation dashboard: `kernel-hub report` runs validation (every registry kernel, every mode this machine
offers), the TPU compile gate, kernelize over the model families and the benches, and writes report.json (schema:
schema.py, docs/report-schema.json) and a static index.html (matrices and inline SVG plots; no server needed).

Light at import: the sections import jax, torch, transformers and matplotlib only when they run.
"""

from __future__ import annotations

__all__ = ["Options", "build_report", "write_report"]


def __getattr__(name: str):  # lazy: assemble pulls in pydantic models, fine, but keep the package import cheap
    if name in __all__:
        from . import assemble

        return getattr(assemble, name)
    raise AttributeError(name)
