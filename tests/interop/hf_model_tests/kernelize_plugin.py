"""pytest plugin (`-p kernelize_plugin`, this folder on PYTHONPATH): every transformers model that transformers' own
model tests build runs kernelized by kernel-hub.

The hook: `PreTrainedModel.post_init` (the last step of every model's `__init__`, `from_pretrained` and
`_from_config` included) gives the model a forward pre-hook, and the model's first call, whatever calls it (the test,
`generate`, a pipeline), runs `kernel_hub.kernelize(model)` before the forward goes on. At the first call rather than
in `post_init` because only then are the weights real (`from_pretrained` builds on the meta device and loads after
`post_init`) and the model whole (`post_init` of an inner model runs before its outer model's `__init__` is done).
The outermost model called is the one kernelized; the models inside it are marked as covered. A call under tracing
(torch.compile, torch.export, fx, fake tensors) does not kernelize: the next eager call does. kernelize runs with
the random generators of torch, NumPy and `random` put back afterwards, so its validation inputs leave the test's
seeded draws as they were; in "training" mode when the model is in train mode (kernelize then checks gradients too).

What ran is recorded per test in `$KH_KERNELIZE_RECORD` (JSON): the models kernelized and the layers swapped, so
"kernelized" is counted, not assumed. An error from kernelize itself propagates: the test fails and says so.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

import pytest

_DONE = "_kh_plugin_done"
_HOOK = "_kh_plugin_hook"
_state: dict[str, Any] = {"test": None, "busy": False}
_records: dict[str, dict[str, Any]] = {}


def _record() -> dict[str, Any]:
    return _records.setdefault(_state["test"] or "<outside a test>", {"models": 0, "replaced": 0, "outcome": None})


def _tracing() -> bool:
    """True inside torch.compile / export / jit / fx tracing or under fake tensors: no kernelize there."""
    import torch

    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    from torch.fx import _symbolic_trace

    fx_tracing = getattr(_symbolic_trace, "is_fx_symbolic_tracing", None)
    if fx_tracing is not None and fx_tracing():
        return True
    from torch._guards import detect_fake_mode

    return detect_fake_mode() is not None


def _cover(model: Any) -> None:
    """Mark `model` and every model inside it as handled and drop their hooks."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.__dict__[_DONE] = True
            handle = module.__dict__.pop(_HOOK, None)
            if handle is not None:
                handle.remove()


def kernelize_once(model: Any) -> bool:
    """Kernelize `model` on its first eager call; True when it was kernelized now."""
    import torch

    import kernel_hub as kh
    from kernel_hub.layers.api import is_kernelized, restore

    if model.__dict__.get(_DONE) or _state["busy"] or _tracing():
        return False
    if any(p.is_meta for p in model.parameters()):
        return False
    for module in model.modules():  # an inner model called on its own first: the outer one is kernelized whole
        if module is not model and is_kernelized(module):
            restore(module)
    _cover(model)
    mode = "training" if model.training else "inference"
    _state["busy"] = True
    py_state, np_state = random.getstate(), _numpy_state()
    try:
        with torch.random.fork_rng(devices=[]), torch.inference_mode(False), torch.enable_grad():
            kh.kernelize(model, mode=mode)
    finally:
        _state["busy"] = False
        random.setstate(py_state)
        _numpy_restore(np_state)
    rec = _record()
    rec["models"] += 1
    rec["replaced"] += len(kh.kernelize_report(model).replaced)
    return True


def _numpy_state() -> Any:
    try:
        import numpy as np
    except ImportError:
        return None
    return np.random.get_state()


def _numpy_restore(state: Any) -> None:
    if state is not None:
        import numpy as np

        np.random.set_state(state)


def _pre_hook(module: Any, args: Any) -> None:
    kernelize_once(module)


def install() -> Any:
    """Patch `PreTrainedModel.post_init` so every model built afterwards gets the first-call hook; returns the
    original, for `uninstall`."""
    from transformers import PreTrainedModel

    original = PreTrainedModel.post_init

    def post_init(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if not self.__dict__.get(_DONE) and _HOOK not in self.__dict__:
            self.__dict__[_HOOK] = self.register_forward_pre_hook(_pre_hook)
        return out

    post_init.__wrapped__ = original
    PreTrainedModel.post_init = post_init
    return original


def uninstall(original: Any) -> None:
    from transformers import PreTrainedModel

    PreTrainedModel.post_init = original


def pytest_configure(config):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_UPDATE_CHECK", "1")
    install()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _state["test"] = item.nodeid


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        rec = _records.setdefault(report.nodeid, {"models": 0, "replaced": 0, "outcome": None})
        if rec["outcome"] in (None, "passed"):
            rec["outcome"] = report.outcome


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("KH_KERNELIZE_RECORD")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(_records, fh, indent=1, sort_keys=True)
