"""The environment of every test process: huggingface_hub pointed at a test server, and nothing leaving loopback.

`point_at` patches this process's huggingface_hub (it reads HF_ENDPOINT and HF_HUB_CACHE once, at import).
`GUARDS` and `child_env` are the one place a test's subprocess environment comes from: the root conftest.py puts
them into os.environ (which `subprocess` children inherit) and checks every child's environment for them, and
every proxy variable points at a loopback recorder, so a request for any host other than loopback is recorded
(and refused) there instead of leaving the machine; each test fails if its processes sent one.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

# huggingface_hub's `hf` asks PyPI for its own update unless told not to. Telemetry is left on: it goes to
# HF_ENDPOINT (loopback here). (HF `kernels` 0.17.2 could not download at all with HF_HUB_DISABLE_TELEMETRY=1;
# 0.19.1 can, tests/server/test_server_clients.py runs it so.)
# pip's own version check is PyPI traffic too.
GUARDS = {"HF_HUB_DISABLE_UPDATE_CHECK": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
LOOPBACK = "127.0.0.1,localhost,::1"


def point_at(monkeypatch: pytest.MonkeyPatch, url: str, cache: Path) -> None:
    """huggingface_hub reads HF_ENDPOINT once, into ENDPOINT and the download URL template: patch both."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


class OutsideTraffic:
    """A loopback listener standing in for every proxy: it records the first bytes of what would have left the
    machine and answers 403, so nothing is ever forwarded."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.seen: list[bytes] = []
        threading.Thread(target=self._serve, name="outside-traffic-recorder", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.seen.append(conn.recv(4096))
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass


_RECORDER: OutsideTraffic | None = None


def recorder() -> OutsideTraffic:
    """The session's one recorder (started on first use, by the root conftest.py)."""
    global _RECORDER
    if _RECORDER is None:
        _RECORDER = OutsideTraffic()
    return _RECORDER


def proxy_env(url: str) -> dict[str, str]:
    """Every proxy variable on `url`, loopback reached directly."""
    return {**dict.fromkeys(PROXY_VARS, url), "NO_PROXY": LOOPBACK, "no_proxy": LOOPBACK}


def child_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """A subprocess environment: `base` (default os.environ) with the guards and the proxy recorder put back."""
    env = dict(os.environ if base is None else base)
    env.update(GUARDS)
    recorder = os.environ.get("HTTPS_PROXY")
    if recorder:
        env.update(proxy_env(recorder))
    env.update(extra)
    return env


def missing_guards(env: Mapping[str, str], recorder_url: str) -> list[str]:
    """What a child environment lacks to stay on loopback (empty: nothing). A child may point its proxies at a
    recorder of its own (test_server_clients does), but never at nothing."""
    missing = [f"{k}={v}" for k, v in GUARDS.items() if env.get(k) != v]
    missing += [name for name in PROXY_VARS if not env.get(name, "").startswith("http://127.0.0.1:")]
    if env.get("NO_PROXY") is None and recorder_url:
        missing.append("NO_PROXY")
    return missing
