"""pytest plugin for both runs (baseline and kernelized) of transformers' model tests: names the test tree expects
that the installed transformers no longer has are set from the JSON file `$KH_TF_COMPAT` (run.py writes it from
the test tree's own transformers source): module-level names of `transformers.testing_utils` ("testing_utils") and
class attributes of `PreTrainedModel` ("PreTrainedModel"), each only where missing. The same plugin loads in both
runs, so it cannot make one differ from the other."""

from __future__ import annotations

import json
import os


def apply(names: dict) -> list[str]:
    """Set every missing name; returns the ones set."""
    import transformers.testing_utils as tu
    from transformers import PreTrainedModel

    done = []
    for owner, table in ((tu, names.get("testing_utils", {})), (PreTrainedModel, names.get("PreTrainedModel", {}))):
        for name, value in table.items():
            if not hasattr(owner, name):
                setattr(owner, name, value)
                done.append(f"{owner.__name__}.{name}")
    return done


def pytest_configure(config):
    path = os.environ.get("KH_TF_COMPAT")
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            apply(json.load(fh))
