"""The one way a bench script saves its result: the JSON file (its folder made), and a line saying where."""

from __future__ import annotations

import json
from pathlib import Path


def write_result(path: Path | str, result: object, indent: int = 2) -> None:
    """Write `result` as JSON to `path` (parents created) and print where it went."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent))
    print(f"wrote {path}")
