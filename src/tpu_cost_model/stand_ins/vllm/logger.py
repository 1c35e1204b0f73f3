"""`vllm.logger` as tpu_inference/logger.py uses it: `_VllmLogger` (a type) and `init_logger(name)`, here the
standard library's logging (the kernels only log; see this package's __init__ for why it exists)."""

from __future__ import annotations

import logging

_VllmLogger = logging.Logger


def init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
