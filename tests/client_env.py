"""Point this process's huggingface_hub at a test server, the way HF_ENDPOINT and HF_HUB_CACHE do at import."""

from __future__ import annotations

from pathlib import Path

import pytest


def point_at(monkeypatch: pytest.MonkeyPatch, url: str, cache: Path) -> None:
    """huggingface_hub reads HF_ENDPOINT once, into ENDPOINT and the download URL template: patch both."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
