"""A test module's compiled programs are released at its end: the worker's memory mappings come back down."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tests.compiled_programs import mapped_regions, release


def test_releasing_drops_the_mappings_compiles_added() -> None:
    if mapped_regions() is None:
        pytest.fail("no /proc/self/maps: the suite runs on Linux")
    release()
    before = mapped_regions()
    for i in range(150):
        jax.jit(lambda x, i=i: x * i + 1)(jnp.ones((8, 8 + i))).block_until_ready()
    grown = mapped_regions()
    assert grown - before >= 50, (before, grown)  # each compiled program keeps code mapped
    release()
    assert mapped_regions() - before < (grown - before) / 4, (before, grown, mapped_regions())
