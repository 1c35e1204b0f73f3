"""Helpers for the TPU compile tests: the TPU environment (or a skip saying how to get one) and tiny kernel packages
written to a temp folder, whose tpu_cases.py declare their own CompileCase type (a kernel package never imports
kernel_hub; these need no vendored shared code)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernel_hub.tpu.env import TpuEnv, TpuEnvironmentError, tpu_env

#: The head of a toy tpu_cases.py: the case type kernel-hub's compile gate reads (name, dtype, tags, build()).
COMPILE_CASE = '''
import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class CompileCase:
    name: str
    dtype: str
    tags: tuple
    build: Callable[[], Any]
'''


def env_or_skip() -> TpuEnv:
    try:
        return tpu_env()
    except TpuEnvironmentError as exc:
        pytest.skip(str(exc))


def write_package(package: Path, files: dict[str, str]) -> Path:
    """`package`/<name> for each file (dedented); tpu_cases.py gets the CompileCase head first."""
    package.mkdir(parents=True)
    for name, text in files.items():
        body = textwrap.dedent(text)
        (package / name).write_text(COMPILE_CASE + body if name == "tpu_cases.py" else body)
    return package
