"""Bounds on every answer a Hub sends this client: a size cap and an overall deadline per request.

A Hub (or anything at HF_ENDPOINT) is untrusted: an endless or huge answer must not take the process's memory, and
a server that trickles one byte every few seconds must not hold a load for ever. huggingface_hub's HTTP client only
bounds each read, so the client installs (hub._install_client_timeout) a transport with:

- a deadline per request, checked at every socket read and write (headers and body alike): API answers
  KERNEL_HUB_HTTP_TIMEOUT seconds (default 30), file downloads (`/resolve/` and the CDN it redirects to)
  KERNEL_HUB_DOWNLOAD_TIMEOUT (default 600), from the request's start to its last byte;
- a size cap: API answers (refs, listings, JSON) KERNEL_HUB_MAX_ANSWER_BYTES (default 16 MiB), file downloads
  KERNEL_HUB_MAX_DOWNLOAD_BYTES (default: a bundle's cap, 512 MiB). An answer whose announced size (Content-Length,
  or the Hub's X-Linked-Size on a HEAD) is over its cap is refused before its body is read; one that announces less
  (or nothing) and sends more is cut at the cap.

Both fail with HubAnswerError, a KernelHubError naming the endpoint and the variable to change; huggingface_hub
never retries it (it retries timeouts and network errors only), so a refused download is not fetched again.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import KernelHubError

TIMEOUT_ENV = "KERNEL_HUB_HTTP_TIMEOUT"
DOWNLOAD_TIMEOUT_ENV = "KERNEL_HUB_DOWNLOAD_TIMEOUT"
MAX_ANSWER_ENV = "KERNEL_HUB_MAX_ANSWER_BYTES"
MAX_DOWNLOAD_ENV = "KERNEL_HUB_MAX_DOWNLOAD_BYTES"
DEFAULT_TIMEOUT = 30.0
DEFAULT_DOWNLOAD_TIMEOUT = 600.0
DEFAULT_MAX_ANSWER = 16 << 20
DEFAULT_MAX_DOWNLOAD = 512 << 20  # buildfmt.MAX_BUNDLE_BYTES: no bundle may unpack to more
T = TypeVar("T")


class HubAnswerError(KernelHubError):
    """A Hub answer over its size cap or past its deadline."""


@dataclass(frozen=True)
class Bounds:
    """The deadline (seconds) and size cap (bytes) of one request, and the variables that set them."""

    seconds: float
    max_bytes: int
    timeout_env: str
    size_env: str


def _number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise KernelHubError(f"{name} must be a number, got {raw!r}") from None
    if value <= 0:
        raise KernelHubError(f"{name} must be positive, got {raw!r}")
    return value


def request_timeout() -> float:
    """KERNEL_HUB_HTTP_TIMEOUT: the overall deadline of one API request (also each read's timeout)."""
    return _number(TIMEOUT_ENV, DEFAULT_TIMEOUT)


def is_file_download(path: str) -> bool:
    """A file's bytes (`.../resolve/...`, or where a resolve redirects: a CDN path outside `/api/`), not an API
    answer (`/api/...`: refs, listings, JSON)."""
    return "/resolve/" in path or "/api/" not in path


def bounds_for(method: str, path: str) -> Bounds:
    """A file download or an API answer (is_file_download): which deadline and cap apply (read from the environment
    at each request, so a process can tighten them)."""
    if is_file_download(path):
        return Bounds(_number(DOWNLOAD_TIMEOUT_ENV, DEFAULT_DOWNLOAD_TIMEOUT),
                      int(_number(MAX_DOWNLOAD_ENV, DEFAULT_MAX_DOWNLOAD)), DOWNLOAD_TIMEOUT_ENV, MAX_DOWNLOAD_ENV)
    return Bounds(request_timeout(), int(_number(MAX_ANSWER_ENV, DEFAULT_MAX_ANSWER)), TIMEOUT_ENV, MAX_ANSWER_ENV)


def announced_size(headers: Any) -> int | None:
    """The largest size an answer's headers announce (Content-Length; X-Linked-Size for a file the Hub keeps
    in LFS), or None."""
    sizes = []
    for name in ("content-length", "x-linked-size"):
        raw = headers.get(name)
        if raw is not None:
            try:
                sizes.append(int(raw))
            except ValueError:
                continue
    return max(sizes) if sizes else None


# -- the deadline, at every socket read and write ---------------------------------------------------------------
_current = threading.local()  # the deadline of the request this thread is sending or reading, with its bounds


def _expired(deadline: tuple[float, Bounds, str]) -> HubAnswerError:
    bounds, url = deadline[1], deadline[2]
    return HubAnswerError(f"answer from {url} timed out: over {bounds.seconds:g}s for the whole request "
                          f"({bounds.timeout_env} sets it)")


def _bounded_timeout(timeout: float | None) -> float | None:
    deadline = getattr(_current, "deadline", None)
    if deadline is None:
        return timeout
    remaining = deadline[0] - time.monotonic()
    if remaining <= 0:
        raise _expired(deadline)
    return remaining if timeout is None else min(timeout, remaining)


def _io(call: Callable[[float | None], T], timeout: float | None) -> T:
    """One socket read or write under the deadline; a timeout that the deadline caused says so."""
    try:
        return call(_bounded_timeout(timeout))
    except Exception as exc:
        deadline = getattr(_current, "deadline", None)
        if deadline is not None and "timeout" in type(exc).__name__.lower() and time.monotonic() >= deadline[0] - 0.05:
            raise _expired(deadline) from None
        raise


class _DeadlineStream:
    """A network stream whose every read and write waits no longer than the current request's deadline."""

    def __init__(self, inner: Any):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return _io(lambda t: self._inner.read(max_bytes, t), timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        _io(lambda t: self._inner.write(buffer, t), timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, _bounded_timeout(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend:
    """httpcore's network backend, with every stream it opens under the current request's deadline."""

    def __init__(self, inner: Any):
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> _DeadlineStream:
        return _DeadlineStream(self._inner.connect_tcp(host, port, _bounded_timeout(timeout), local_address,
                                                       socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> _DeadlineStream:
        return _DeadlineStream(self._inner.connect_unix_socket(path, _bounded_timeout(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Under:
    """Run a block under one request's deadline (restoring any outer one)."""

    def __init__(self, deadline: tuple[float, Bounds, str]):
        self._deadline = deadline

    def __enter__(self) -> None:
        self._outer = getattr(_current, "deadline", None)
        _current.deadline = self._deadline

    def __exit__(self, *exc: object) -> None:
        _current.deadline = self._outer


# -- the transport ------------------------------------------------------------------------------------------------
def bounded_transport(**transport_options: Any) -> Any:
    """An httpx2 transport that keeps every answer to its Bounds (see the module docstring)."""
    import httpx2

    inner = httpx2.HTTPTransport(**transport_options)
    pool = getattr(inner, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is not None:  # httpcore's pool: every socket read and write sees the deadline
        pool._network_backend = _DeadlineBackend(backend)

    class BoundedStream(httpx2.SyncByteStream):
        def __init__(self, stream: Any, bounds: Bounds, deadline: tuple[float, Bounds, str]):
            self._stream, self._bounds, self._deadline = stream, bounds, deadline

        def __iter__(self) -> Iterator[bytes]:
            total = 0
            chunks = iter(self._stream)
            while True:
                with _Under(self._deadline):
                    _bounded_timeout(None)  # past the deadline between two chunks: stop here
                    chunk = next(chunks, None)
                if chunk is None:
                    return
                total += len(chunk)
                if total > self._bounds.max_bytes:
                    raise _too_large(self._deadline[2], f"more than {self._bounds.max_bytes} bytes",
                                     self._bounds)
                yield chunk

        def close(self) -> None:
            self._stream.close()

    class BoundedTransport(httpx2.BaseTransport):
        def handle_request(self, request: Any) -> Any:
            bounds = bounds_for(request.method, request.url.path)
            url = f"{request.url.scheme}://{request.url.netloc.decode('ascii', 'replace')}{request.url.path}"
            deadline = (time.monotonic() + bounds.seconds, bounds, url)
            with _Under(deadline):
                response = inner.handle_request(request)
            size = announced_size(response.headers)
            if size is not None and size > bounds.max_bytes and response.status_code < 300:
                response.close()
                raise _too_large(url, f"{size} bytes announced", bounds)
            response.stream = BoundedStream(response.stream, bounds, deadline)
            return response

        def close(self) -> None:
            inner.close()

    return BoundedTransport()


def _too_large(url: str, what: str, bounds: Bounds) -> HubAnswerError:
    return HubAnswerError(f"answer from {url} is too large ({what}; the cap is {bounds.max_bytes} bytes, "
                          f"{bounds.size_env} sets it)")
