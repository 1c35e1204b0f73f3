"""A cached listing that disagrees with what the Hub serves (one a hostile answer left) is dropped and listed again:
it never poisons later downloads from an honest server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

from kernel_hub.decide.versions import resolve
from kernel_hub.package import buildfmt as fmt
from kernel_hub.publish.release import publish
from kernel_hub.sources.hub.source import HubSource
from tests.hub_server import running_server
from tests.toy_folder import copy_toy

TOKEN = "listing-token"
REPO = "acme/listed"


def test_a_poisoned_cached_listing_is_listed_again(tmp_path: Path) -> None:
    with running_server(tmp_path / "store", token=TOKEN) as server:
        publish(copy_toy(tmp_path / "k", "1.0.0"), repo_id=REPO, endpoint=server.url, token=TOKEN, skip_validation=True,
                skip_tpu_compile=True, log=lambda _: None)
        source = HubSource(endpoint=server.url, token=False, cache_dir=tmp_path / "cache", offline=False)
        commit = resolve(source.refs(REPO), version=1).commit
        honest = source.listing(REPO, commit)
        # what a listing naming build/jax-cpu.tar twice left before: the other id for the bundle
        poisoned = {**honest, "bundles": {**honest["bundles"], "jax-cpu": "f" * 40}}
        source.cache.listing_file(REPO, commit).write_text(json.dumps(poisoned))
        fresh = HubSource(endpoint=server.url, token=False, cache_dir=tmp_path / "cache", offline=False)
        build = fresh.fetch(REPO, commit, fmt.variant_from_name("jax-cpu"))
        assert build.commit == commit and build.package_dir.is_dir()
        assert json.loads(fresh.cache.listing_file(REPO, commit).read_text()) == honest
