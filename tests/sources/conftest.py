"""What the hub-source tests share: small caps on what a Hub answer may cost."""

from __future__ import annotations

import pytest

#: (API request timeout, download timeout) in seconds; a module may set SMALL_CAP_TIMEOUTS to its own pair.
SMALL_CAP_TIMEOUTS = (1.5, 3.0)


@pytest.fixture
def small_caps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers capped at 64 KiB, downloads at 256 KiB, the timeouts the test module names (SMALL_CAP_TIMEOUTS), and
    the Hub online: a hostile loopback server hits each bound within seconds."""
    http, download = getattr(request.module, "SMALL_CAP_TIMEOUTS", SMALL_CAP_TIMEOUTS)
    monkeypatch.setenv("KERNEL_HUB_HTTP_TIMEOUT", str(http))
    monkeypatch.setenv("KERNEL_HUB_DOWNLOAD_TIMEOUT", str(download))
    monkeypatch.setenv("KERNEL_HUB_MAX_ANSWER_BYTES", str(64 << 10))
    monkeypatch.setenv("KERNEL_HUB_MAX_DOWNLOAD_BYTES", str(256 << 10))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
