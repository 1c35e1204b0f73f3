"""The ragged dot's torch build for the tests that check it (test_quantized_*.py): loaded by kernel-hub from this
kernel folder, as a torch user gets it, once per test module."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernel_hub as kh


@pytest.fixture(scope="module")
def rd():
    """The torch build for CPU of this kernel folder."""
    return kh.get_local_kernel(Path(__file__).resolve().parents[1], framework="torch", backend="cpu")
