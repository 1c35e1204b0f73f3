"""Bounds that hold through what an answer does besides being long: compression (counted decoded), retries (the
server's Retry-After capped, the retries counted per operation, none past the deadline), pages (a cap, and on empty
pages with a next link) and redirects (an API request keeps its bounds and its deadline wherever it is sent).
Against a hostile loopback server, with small caps; a call that would hang on a client without these bounds runs in
a thread that the test stops waiting for."""

from __future__ import annotations

import gzip
import json
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("huggingface_hub")

from kernel_hub.errors import KernelHubError
from kernel_hub.sources import http_limits
from kernel_hub.sources.hub.source import HubSource
from tests.sources.test_hub_answer_bounds import BLOB, COMMIT, REPO, hostile, lying_file

REFS = {"branches": [], "tags": [], "converts": []}


#: the small_caps fixture's timeouts (tests/sources/conftest.py), longer here: retries and redirects need several
#: requests inside one operation's deadline
SMALL_CAP_TIMEOUTS = (4.0, 6.0)


def _source(url: str, cache: Path) -> HubSource:
    return HubSource(endpoint=url, token=False, cache_dir=cache, offline=False)


def ends(call: Callable[[], Any], within: float = 60.0) -> BaseException | Any:
    """Run `call` in a thread: its exception or result, or a failure if it has not ended within `within` seconds
    (a client without the bound under test waits for hours)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    assert not thread.is_alive(), f"the call had not ended after {within}s"
    return out[0]


def _send(handler, status: int, body: bytes, headers: dict[str, str]) -> None:
    handler.send_response(status)
    for key, value in headers.items():
        handler.send_header(key, value)
    if "Content-Length" not in headers:
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.send_body(body)


def _padded_refs(size: int) -> bytes:
    return json.dumps({**REFS, "pad": " " * size}).encode()


def _deflate(data: bytes) -> bytes:
    return zlib.compress(data, 9)


ENCODINGS = {
    "gzip": ("gzip", lambda d: gzip.compress(d, 9)),
    "double-gzip": ("gzip, gzip", lambda d: gzip.compress(gzip.compress(d, 9), 9)),
    "deflate": ("deflate", _deflate),
}


@pytest.mark.parametrize("kind", sorted(ENCODINGS))
def test_an_api_answer_is_capped_on_its_decoded_size(small_caps, tmp_path: Path, kind: str) -> None:
    header, encode = ENCODINGS[kind]
    body = encode(_padded_refs(32 << 20))  # 32 MiB of JSON in a few tens of KB on the wire, under the 64 KiB cap
    assert len(body) < 64 << 10
    answer = {"/refs": lambda h: _send(h, 200, body, {"Content-Encoding": header, "Content-Type": "application/json"})}
    with hostile(answer) as (url, _, _), pytest.raises(KernelHubError, match="KERNEL_HUB_MAX_ANSWER_BYTES") as info:
        _source(url, tmp_path / "cache").refs(REPO)
    assert "decoded" in str(info.value)


def test_a_small_compressed_answer_still_reads(small_caps, tmp_path: Path) -> None:
    """The decoding is real: a gzip answer within the cap is the refs it encodes."""
    refs = {"branches": [{"name": "v1", "ref": "refs/heads/v1", "targetCommit": COMMIT}], "tags": [], "converts": []}
    body = gzip.compress(json.dumps(refs).encode())
    with hostile({"/refs": lambda h: _send(h, 200, body, {"Content-Encoding": "gzip",
                                                          "Content-Type": "application/json"})}) as (url, _, _):
        got = _source(url, tmp_path / "cache").refs(REPO)
    assert [(r.name, r.kind, r.commit) for r in got] == [("v1", "branch", COMMIT)]


def test_an_unbounded_encoding_is_refused(small_caps, tmp_path: Path) -> None:
    with hostile({"/refs": lambda h: _send(h, 200, b"\x00" * 10, {"Content-Encoding": "br"})}) as (url, _, _), \
            pytest.raises(KernelHubError, match="Content-Encoding 'br' is not accepted"):
        _source(url, tmp_path / "cache").refs(REPO)


def _gzip_download(handler) -> None:
    """A HEAD announcing 1000 bytes, then a GET whose gzip body inflates to 64 MiB."""
    headers = {"ETag": f'"{BLOB}"', "X-Repo-Commit": COMMIT}
    if handler.command == "HEAD":
        _send(handler, 200, b"", {**headers, "Content-Length": "1000"})
        return
    _send(handler, 200, _GZIP_64MIB, {**headers, "Content-Encoding": "gzip"})


_GZIP_64MIB = gzip.compress(b"x" * (64 << 20), 9)


def test_a_download_is_capped_on_its_decoded_size_while_it_streams(small_caps, tmp_path: Path) -> None:
    assert len(_GZIP_64MIB) < 256 << 10
    with hostile({"/resolve/": _gzip_download}) as (url, _, _), \
            pytest.raises(KernelHubError, match="KERNEL_HUB_MAX_DOWNLOAD_BYTES"):
        _source(url, tmp_path / "cache").fetcher.download_bundle(REPO, COMMIT, "jax-cpu", force=False)
    kept = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert all(p.stat().st_size <= 256 << 10 for p in kept), [(p.name, p.stat().st_size) for p in kept]


def test_a_build_budget_holds_while_its_files_stream(monkeypatch, tmp_path: Path) -> None:
    """A file whose HEAD announces 1000 bytes and whose body never ends, fetched as part of a build with 100 KiB
    left: cut at the build's budget (well under the 64 MiB per-file cap), nothing over it written."""
    monkeypatch.setenv("KERNEL_HUB_MAX_DOWNLOAD_BYTES", str(64 << 20))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with hostile({"/resolve/": lying_file}) as (url, _, sent):
        source = _source(url, tmp_path / "cache")
        with http_limits.operation("fetching a build", download=True, max_bytes=100 << 10), \
                pytest.raises(KernelHubError, match="more than 102400 bytes for one build"):
            source.fetcher.download_file(REPO, COMMIT, "build/torch-cpu/x/_ops.py", BLOB, force=False)
    assert sent[0] < 32 << 20
    kept = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert all(p.stat().st_size <= 100 << 10 for p in kept), [(p.name, p.stat().st_size) for p in kept]


@pytest.mark.parametrize(("status", "headers"), [(503, {"Retry-After": "100000"}),
                                                 (429, {"RateLimit": '"api";r=0;t=100000'})],
                         ids=["retry-after", "ratelimit"])
def test_retry_after_never_waits_past_the_deadline(small_caps, tmp_path: Path, status: int, headers) -> None:
    answer = {"/tree/": lambda h: _send(h, status, b"busy", headers)}
    with hostile(answer) as (url, seen, _):
        got = ends(lambda: _source(url, tmp_path / "cache").listing(REPO, COMMIT))
    assert isinstance(got, KernelHubError) and "KERNEL_HUB_HTTP_TIMEOUT" in str(got), got
    assert len(seen) == 1  # even the capped wait (10 s) ends past the 4 s deadline: no retry at all


def test_a_download_keeps_one_deadline_through_its_retries(small_caps, tmp_path: Path) -> None:
    """A 3 s wait fits the 6 s download deadline once, not twice: the download fails at its deadline or its retry
    cap, whichever comes first, instead of huggingface_hub's five retries of 4 s each (HEAD and GET alike)."""
    with hostile({"/resolve/": lambda h: _send(h, 503, b"busy", {"Retry-After": "3"})}) as (url, seen, _):
        fetcher = _source(url, tmp_path / "cache").fetcher
        got = ends(lambda: fetcher.download_bundle(REPO, COMMIT, "jax-cpu", force=False))
    assert isinstance(got, http_limits.HubAnswerError), got
    said = str(got)
    assert "past the operation's 6s deadline (KERNEL_HUB_DOWNLOAD_TIMEOUT" in said or "at most 3 retries" in said
    assert len(seen) <= http_limits.MAX_RETRIES + 1


def test_retries_are_counted_per_operation(small_caps, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KERNEL_HUB_HTTP_TIMEOUT", "30")
    with hostile({"/tree/": lambda h: _send(h, 429, b"slow down", {"Retry-After": "0"})}) as (url, seen, _):
        got = ends(lambda: _source(url, tmp_path / "cache").listing(REPO, COMMIT))
    assert isinstance(got, KernelHubError) and f"at most {http_limits.MAX_RETRIES} retries" in str(got), got
    assert len(seen) == http_limits.MAX_RETRIES + 1


def _pages(empty: bool) -> Callable[[Any], None]:
    def answer(handler) -> None:
        n = int(handler.path.rsplit("cursor=", 1)[1]) if "cursor=" in handler.path else 0
        entries = [] if empty else [{"type": "file", "path": f"build/v{n}.tar", "oid": BLOB, "size": 10}]
        base = handler.path.split("?", 1)[0]
        link = f'<http://{handler.headers["Host"]}{base}?cursor={n + 1}>; rel="next"'
        _send(handler, 200, json.dumps(entries).encode(), {"Content-Type": "application/json", "Link": link})
    return answer


@pytest.mark.parametrize("empty", [True, False], ids=["empty-pages", "endless-pages"])
def test_a_listing_that_pages_for_ever_is_refused(small_caps, monkeypatch, tmp_path: Path, empty: bool) -> None:
    monkeypatch.setenv("KERNEL_HUB_HTTP_TIMEOUT", "60")
    monkeypatch.setattr(http_limits, "MAX_PAGES", 30)  # the bound is read at each page: a smaller one, a faster test
    with hostile({"/tree/": _pages(empty)}) as (url, seen, _):
        got = ends(lambda: _source(url, tmp_path / "cache").listing(REPO, COMMIT))
    assert isinstance(got, KernelHubError) and ("empty pages" if empty else "pages on past") in str(got), got
    assert len(seen) == (http_limits.MAX_EMPTY_PAGES + 1 if empty else http_limits.MAX_PAGES + 1)
    assert not list((tmp_path / "cache").rglob("listings/*.json"))


def test_an_api_request_keeps_the_api_cap_wherever_it_is_redirected(small_caps, tmp_path: Path) -> None:
    body = _padded_refs(128 << 10)  # over the API cap (64 KiB), under the download cap (256 KiB)
    routes = {"/api/kernels/": lambda h: _send(h, 302, b"", {"Location": "/elsewhere/refs.json"}),
              "/elsewhere/": lambda h: _send(h, 200, body, {"Content-Type": "application/json"})}
    with hostile(routes) as (url, seen, _), pytest.raises(KernelHubError, match="KERNEL_HUB_MAX_ANSWER_BYTES"):
        _source(url, tmp_path / "cache").refs(REPO)
    assert [p for _, p in seen][-1] == "/elsewhere/refs.json"


def test_a_redirect_chain_keeps_one_deadline(small_caps, monkeypatch, tmp_path: Path) -> None:
    """Ten hops of 0.5 s each, every one well inside a 2 s deadline, fail as one request of 5 s."""
    monkeypatch.setenv("KERNEL_HUB_HTTP_TIMEOUT", "2")
    import time

    def hop(handler) -> None:
        n = int(handler.path.rsplit("/", 1)[1]) if handler.path.startswith("/hop/") else 0
        time.sleep(0.5)
        if n < 10:
            _send(handler, 307, b"", {"Location": f"/hop/{n + 1}"})
        else:
            _send(handler, 200, json.dumps(REFS).encode(), {"Content-Type": "application/json"})

    with hostile({"/api/kernels/": hop, "/hop/": hop}) as (url, seen, _):
        got = ends(lambda: _source(url, tmp_path / "cache").refs(REPO))
    assert isinstance(got, KernelHubError) and "KERNEL_HUB_HTTP_TIMEOUT" in str(got), got
    assert len(seen) < 11


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e309", "-5", "0"])
@pytest.mark.parametrize("name", [http_limits.TIMEOUT_ENV, http_limits.DOWNLOAD_TIMEOUT_ENV,
                                  http_limits.MAX_ANSWER_ENV, http_limits.MAX_DOWNLOAD_ENV])
def test_every_limit_variable_refuses_non_finite_and_non_positive_values(monkeypatch, tmp_path: Path, name: str,
                                                                         value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(KernelHubError, match=name):
        _source("http://127.0.0.1:9", tmp_path)


def test_the_cli_says_an_inflating_answer_in_one_line(tmp_path: Path) -> None:
    """`kernel-hub list --hub` against an endpoint whose 32 KB gzip answer inflates to 32 MiB: exit 1, one line
    naming the variable, no traceback."""
    import os
    import subprocess

    from tests.hub_server import cli_command

    body = gzip.compress(json.dumps([{"id": "acme/x", "pad": " " * (32 << 20)}]).encode(), 9)
    answer = {"/api/kernels": lambda h: _send(h, 200, body, {"Content-Encoding": "gzip",
                                                             "Content-Type": "application/json"})}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KERNEL_HUB_"))}
    env.update(HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_DISABLE_UPDATE_CHECK="1",
               HF_HUB_DISABLE_TELEMETRY="1", KERNEL_HUB_MAX_ANSWER_BYTES=str(64 << 10),
               PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    with hostile(answer) as (url, _, _):
        done = subprocess.run([*cli_command(), "list", "--hub", "acme", "--endpoint", url], capture_output=True,
                              text=True, timeout=120, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "KERNEL_HUB_MAX_ANSWER_BYTES" in lines[0] and "decoded" in lines[0], lines[0]
