"""The client bounds every Hub answer: a size cap (announced sizes refused before reading, lying ones cut at the
cap), an overall deadline per request (a trickling server fails at the deadline, not per read), nothing oversize
cached, and a listing naming one path twice refused. Against a hostile loopback server, with small caps."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")

from kernel_hub.errors import IntegrityError, KernelHubError
from kernel_hub.sources.hub.source import HubSource

REPO = "acme/hostile"
COMMIT = "a" * 40
BLOB = "b" * 40

Behaviour = Callable[[BaseHTTPRequestHandler], None]


@contextmanager
def hostile(routes: dict[str, Behaviour]) -> Iterator[tuple[str, list[tuple[str, str]], list[int]]]:
    """A loopback HTTP server answering the first route whose key is in the request path; it records each request
    and counts the body bytes it managed to send."""
    seen: list[tuple[str, str]] = []
    sent = [0]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _answer(self) -> None:
            seen.append((self.command, self.path))
            for key, behaviour in routes.items():
                if key in self.path:
                    with suppress(BrokenPipeError, ConnectionResetError):
                        behaviour(self)
                    return
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def send_body(self, data: bytes) -> None:
            self.wfile.write(data)
            self.wfile.flush()
            sent[0] += len(data)

        do_GET = do_HEAD = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen, sent
    finally:
        server.shutdown()
        server.server_close()


def endless_json(handler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    chunk = b'{"id": "acme/x", "sha": "' + b"0" * 40 + b'"},'
    payload = b"[" + chunk * 200
    for _ in range(100_000):
        handler.send_body(b"%x\r\n%s\r\n" % (len(payload), payload))
        payload = chunk * 200


def trickle_body(handler) -> None:
    body = json.dumps({"branches": [], "tags": [], "converts": []}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    for byte in body:
        handler.send_body(bytes([byte]))
        time.sleep(0.25)


def trickle_headers(handler) -> None:
    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200:
        handler.wfile.write(bytes([byte]))
        handler.wfile.flush()
        time.sleep(0.25)


def huge_refs(handler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(50 << 20))
    handler.end_headers()
    handler.send_body(b'{"branches": [' + b" " * 65536)


def file_head(size: int) -> Behaviour:
    def answer(handler) -> None:
        handler.send_response(200)
        handler.send_header("ETag", f'"{BLOB}"')
        handler.send_header("X-Repo-Commit", COMMIT)
        handler.send_header("Content-Length", str(size))
        handler.end_headers()
        if handler.command == "GET":  # the announcement lies: an endless body
            handler.send_body(b"x" * min(size, 1 << 20))
    return answer


def lying_file(handler) -> None:
    handler.send_response(200)
    handler.send_header("ETag", f'"{BLOB}"')
    handler.send_header("X-Repo-Commit", COMMIT)
    if handler.command == "HEAD":
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        return
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    block = b"x" * 65536
    for _ in range(10_000):
        handler.send_body(b"%x\r\n%s\r\n" % (len(block), block))


def duplicate_listing(handler) -> None:
    entries = [{"type": "file", "path": "build/jax-cpu.tar", "oid": oid, "size": 10} for oid in (BLOB, "c" * 40)]
    body = json.dumps(entries).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.send_body(body)


def _source(url: str, cache: Path) -> HubSource:
    return HubSource(endpoint=url, token=False, cache_dir=cache, offline=False)


def test_an_endless_listing_is_cut_at_the_cap(small_caps, tmp_path: Path) -> None:
    with (hostile({"/api/kernels": endless_json}) as (url, _, sent),
          pytest.raises(KernelHubError, match="KERNEL_HUB_MAX_ANSWER_BYTES")):
        _source(url, tmp_path / "cache").client.list_kernel_repos("acme")
    assert sent[0] < 32 << 20  # of ~1.8 GB on offer: stopped long before it ran out


@pytest.mark.parametrize("behaviour", [trickle_body, trickle_headers], ids=["body", "headers"])
def test_a_trickling_server_fails_at_the_deadline(small_caps, tmp_path: Path, behaviour: Behaviour) -> None:
    # the answer trickles a byte every 0.25 s (~11 s in all, each read within a per-read timeout): only the
    # whole request's deadline ends the call, and the error names the variable that sets it
    with hostile({"/refs": behaviour}) as (url, _, _), pytest.raises(KernelHubError, match="KERNEL_HUB_HTTP_TIMEOUT"):
        _source(url, tmp_path / "cache").refs(REPO)


def test_oversize_refs_are_refused_from_the_announced_size_and_never_cached(small_caps, tmp_path: Path) -> None:
    with hostile({"/refs": huge_refs}) as (url, _, sent):
        source = _source(url, tmp_path / "cache")
        with pytest.raises(KernelHubError, match="announced"):
            source.refs(REPO)
    assert sent[0] <= 128 << 10
    assert not list((tmp_path / "cache").rglob("refs.json"))


def test_a_bundle_announced_over_the_cap_is_never_downloaded(small_caps, tmp_path: Path) -> None:
    with hostile({"/resolve/": file_head(20 << 30)}) as (url, seen, sent), \
            pytest.raises(KernelHubError, match="KERNEL_HUB_MAX_DOWNLOAD_BYTES"):
        _source(url, tmp_path / "cache").fetcher.download_bundle(REPO, COMMIT, "jax-cpu", force=False)
    assert not [r for r in seen if r[0] == "GET"]  # refused from the HEAD
    assert sent[0] == 0


def test_a_bundle_that_lies_about_its_size_is_cut_at_the_cap_once(small_caps, tmp_path: Path) -> None:
    with hostile({"/resolve/": lying_file}) as (url, seen, sent), \
            pytest.raises(KernelHubError, match="KERNEL_HUB_MAX_DOWNLOAD_BYTES"):
        _source(url, tmp_path / "cache").fetcher.download_bundle(REPO, COMMIT, "jax-cpu", force=False)
    assert len([r for r in seen if r[0] == "GET"]) == 1  # not fetched again
    assert sent[0] < 32 << 20  # of 640 MiB on offer (loopback socket buffers hold a few MiB more than read)
    kept = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert all(p.stat().st_size <= 256 << 10 for p in kept)


def test_a_listing_naming_a_path_twice_is_refused_and_not_cached(small_caps, tmp_path: Path) -> None:
    with hostile({"/tree/": duplicate_listing}) as (url, _, _):
        source = _source(url, tmp_path / "cache")
        with pytest.raises(IntegrityError, match="twice"):
            source.listing(REPO, COMMIT)
    assert not list((tmp_path / "cache").rglob("listings/*.json"))


def test_api_answers_and_file_downloads_get_their_own_bounds() -> None:
    from kernel_hub.sources.http_limits import is_file_download

    assert not is_file_download("/api/kernels/acme/x/refs")
    assert not is_file_download("/mirror/api/kernels/acme/x/tree/main/build")
    assert is_file_download("/kernels/acme/x/resolve/" + COMMIT + "/build/jax-cpu.tar")
    assert is_file_download("/kernels/acme/x/resolve/main/build/api/jax-cpu.tar")  # a file named like the API
    assert is_file_download("/repos/ab/cd/0123456789abcdef")  # where the Hub's resolve redirects (its CDN)
