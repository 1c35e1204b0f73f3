"""listing.listing_from_tree: what a commit publishes under build/, from a tree listing's entries (no server)."""

from __future__ import annotations

import pytest
from huggingface_hub.hf_api import RepoFile, RepoFolder

from kernel_hub.errors import IntegrityError
from kernel_hub.sources.hub.listing import listing_from_tree

BLOB_A, BLOB_B, BLOB_C = "a" * 40, "b" * 40, "c" * 40


def _file(path: str, oid: str, size: int = 10) -> RepoFile:
    return RepoFile(path=path, size=size, oid=oid)


def test_bundles_trees_and_sizes_come_apart_and_unsafe_names_are_dropped() -> None:
    listed = listing_from_tree([
        _file("build/jax-cpu.tar", BLOB_A, 100),
        RepoFolder(path="build/torch-cpu", oid=BLOB_C),
        _file("build/torch-cpu/metadata.json", BLOB_B, 7),
        _file("build/torch-cpu/x/../../escape.py", BLOB_C),   # a path outside its variant: left out
        _file("build/-rf.tar", BLOB_C),                        # a name a tool reads as an option: left out
        _file("build/jax-tpu.tar", "not-a-blob-id"),           # not a git blob id: left out
    ], "acme/x@0123")
    assert listed["bundles"] == {"jax-cpu": BLOB_A}
    assert listed["trees"] == {"torch-cpu": {"metadata.json": BLOB_B}}
    assert listed["sizes"]["jax-cpu.tar"] == 100 and listed["sizes"]["torch-cpu/metadata.json"] == 7


def test_a_path_listed_twice_refuses_the_whole_listing() -> None:
    with pytest.raises(IntegrityError, match="names build/jax-cpu.tar twice"):
        listing_from_tree([_file("build/jax-cpu.tar", BLOB_A), _file("build/jax-cpu.tar", BLOB_B)], "acme/x@0123")
