"""Bounds on every answer a Hub sends this client: a size cap per request, a deadline per request and per operation,
and a cap on retries, waits and pages.

A Hub (or anything at HF_ENDPOINT) is untrusted: an endless, huge or hugely inflating answer must not take the process's
memory, and a server that trickles, redirects, pages or asks to be retried for ever must not hold a load for ever.
huggingface_hub's HTTP client only bounds each read and retries as the server asks, so the client installs
(hub.client.install_client_timeout) a transport with:

- a deadline per request, checked at every socket read and write (headers and body alike): API answers
  KERNEL_HUB_HTTP_TIMEOUT seconds (default 30), file downloads (`/resolve/` and the CDN it redirects to)
  KERNEL_HUB_DOWNLOAD_TIMEOUT (default 600), from the request's start to its last byte; a redirect keeps the
  deadline and the bounds of the request it came from (an API request redirected anywhere stays an API request);
- a deadline per operation (`operation`: a refs or tree listing, a download with its HEAD), through every retry,
  redirect and page of it: the same variables, counted from the operation's start;
- a size cap counted on the bytes an answer decodes to (gzip and deflate, stacked up to MAX_LAYERS, undone here in
  pieces of at most PIECE bytes; any other encoding refused), checked while it streams: API answers (refs,
  listings, JSON) KERNEL_HUB_MAX_ANSWER_BYTES (default 16 MiB), file downloads KERNEL_HUB_MAX_DOWNLOAD_BYTES
  (default 512 MiB), which also caps one build's files together (`operation`'s max_bytes). An answer whose
  announced size (Content-Length, or the Hub's X-Linked-Size on a HEAD) is over its cap is refused before its body
  is read;
- retries: an answer huggingface_hub would retry (408, 429, 5xx) has its Retry-After replaced by one of at most
  MAX_RETRY_WAIT seconds; inside an operation at most MAX_RETRIES retries, and none whose wait would end past the
  deadline: the operation fails at once instead;
- pages: inside an operation at most MAX_PAGES answers with a next link, at most MAX_EMPTY_PAGES of them empty.

Every refusal is a HubAnswerError, a KernelHubError naming the endpoint and the variable or bound to change;
huggingface_hub never retries it (it retries timeouts and network errors only), so a refused download is not
fetched again.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import KernelHubError

if TYPE_CHECKING:
    import ssl

    import httpcore2
    import httpx2

TIMEOUT_ENV = "KERNEL_HUB_HTTP_TIMEOUT"
DOWNLOAD_TIMEOUT_ENV = "KERNEL_HUB_DOWNLOAD_TIMEOUT"
MAX_ANSWER_ENV = "KERNEL_HUB_MAX_ANSWER_BYTES"
MAX_DOWNLOAD_ENV = "KERNEL_HUB_MAX_DOWNLOAD_BYTES"
DEFAULT_TIMEOUT = 30.0
DEFAULT_DOWNLOAD_TIMEOUT = 600.0
DEFAULT_MAX_ANSWER = 16 << 20
DEFAULT_MAX_DOWNLOAD = 512 << 20  # buildfmt.MAX_BUNDLE_BYTES: no bundle may unpack to more
#: Retries of one operation (huggingface_hub's own default is 5 per call, each call of an operation afresh).
MAX_RETRIES = 3
#: The longest wait before a retry a server may ask for (Retry-After, RateLimit); huggingface_hub adds 1 s.
MAX_RETRY_WAIT = 10
#: Answers with a next link one operation follows, and how many of them may be empty.
MAX_PAGES = 200
MAX_EMPTY_PAGES = 2
#: What huggingface_hub retries: these statuses, and timeouts and network errors.
RETRIED_STATUS = frozenset({408, 429, 500, 502, 503, 504})
T = TypeVar("T")


class HubAnswerError(KernelHubError):
    """A Hub answer over its size cap or past its deadline, or an operation over its retries or pages."""


@dataclass(frozen=True)
class Bounds:
    """The deadline (seconds) and size cap (bytes) of one request, and the variables that set them."""

    seconds: float
    max_bytes: int
    timeout_env: str
    size_env: str


def _number(name: str, default: float) -> float:
    """A positive finite number from the environment variable `name` (unset or empty: `default`)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise KernelHubError(f"{name} must be a number, got {raw[:40]!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise KernelHubError(f"{name} must be a positive finite number, got {raw[:40]!r}")
    return value


def _byte_count(name: str, default: int) -> int:
    value = _number(name, default)
    if value < 1 or value > 1 << 62:
        raise KernelHubError(f"{name} must be a byte count from 1 to 2**62, got {os.environ.get(name, '')[:40]!r}")
    return int(value)


def request_timeout() -> float:
    """KERNEL_HUB_HTTP_TIMEOUT: the overall deadline of one API request or operation (also each read's timeout)."""
    return _number(TIMEOUT_ENV, DEFAULT_TIMEOUT)


def download_timeout() -> float:
    """KERNEL_HUB_DOWNLOAD_TIMEOUT: the overall deadline of one file download (its HEAD, redirects and retries)."""
    return _number(DOWNLOAD_TIMEOUT_ENV, DEFAULT_DOWNLOAD_TIMEOUT)


def build_byte_cap() -> int:
    """KERNEL_HUB_MAX_DOWNLOAD_BYTES: the most bytes one file, and one build's files together, may hold."""
    return _byte_count(MAX_DOWNLOAD_ENV, DEFAULT_MAX_DOWNLOAD)


def check_limits() -> None:
    """Read every limit variable once, so a bad value fails before any request (naming the variable)."""
    request_timeout()
    download_timeout()
    build_byte_cap()
    _byte_count(MAX_ANSWER_ENV, DEFAULT_MAX_ANSWER)


def is_file_download(path: str) -> bool:
    """A file's bytes (`.../resolve/...`, or where a resolve redirects: a CDN path outside `/api/`), not an API
    answer (`/api/...`: refs, listings, JSON)."""
    return "/resolve/" in path or "/api/" not in path


def api_bounds() -> Bounds:
    return Bounds(request_timeout(), _byte_count(MAX_ANSWER_ENV, DEFAULT_MAX_ANSWER), TIMEOUT_ENV, MAX_ANSWER_ENV)


def bounds_for(method: str, path: str) -> Bounds:
    """A file download or an API answer (is_file_download): which deadline and cap apply (read from the environment
    at each request, so a process can tighten them)."""
    if is_file_download(path):
        return Bounds(download_timeout(), build_byte_cap(), DOWNLOAD_TIMEOUT_ENV, MAX_DOWNLOAD_ENV)
    return api_bounds()


def announced_size(headers: httpx2.Headers) -> int | None:
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


def retry_wait(headers: httpx2.Headers) -> float:
    """The wait (seconds) a retryable answer asks for: Retry-After in seconds, or a RateLimit header's `t=`; 0 when
    it asks for none. An HTTP-date Retry-After counts as 0 (huggingface_hub ignores it too)."""
    raw = headers.get("retry-after")
    if raw is not None and raw.strip().isdigit():
        return float(raw.strip()[:12])
    limit = headers.get("ratelimit") or ""
    for part in limit.split(";"):
        key, _, value = part.strip().partition("=")
        if key.strip() == "t" and value.strip().isdigit():
            return float(value.strip()[:12])
    return 0.0


# -- Content-Encoding undone piece by piece: caps count what an answer inflates to -------------------------------
#: The most bytes one decoding step yields: memory per answer stays near this, whatever the compression ratio.
PIECE = 1 << 20
#: The most Content-Encoding layers an answer may stack.
MAX_LAYERS = 3
ACCEPTED = ("gzip", "x-gzip", "deflate", "identity")
#: What the client asks for: only what it can decode with a bound.
ACCEPT_ENCODING = "gzip, deflate"


class DecodeError(ValueError):
    """An answer whose Content-Encoding is not accepted or whose compressed bytes are damaged."""


def encodings(header: str | None) -> list[str]:
    """The layers of a Content-Encoding header that do something, in the order they were applied.

    Raises DecodeError for an encoding not in ACCEPTED or more than MAX_LAYERS layers."""
    layers = [part.strip().lower() for part in (header or "").split(",") if part.strip()]
    unknown = [layer for layer in layers if layer not in ACCEPTED]
    if unknown:
        raise DecodeError(f"Content-Encoding {unknown[0][:20]!r} is not accepted (only {', '.join(ACCEPTED[:3])})")
    layers = [layer for layer in layers if layer != "identity"]
    if len(layers) > MAX_LAYERS:
        raise DecodeError(f"{len(layers)} Content-Encoding layers (at most {MAX_LAYERS})")
    return layers


def _inflate(chunks: Iterable[bytes], layer: str) -> Iterator[bytes]:
    """One layer undone, each yielded piece at most PIECE bytes long."""
    wbits = 16 + zlib.MAX_WBITS if layer in ("gzip", "x-gzip") else zlib.MAX_WBITS
    decoder = zlib.decompressobj(wbits)
    first = True
    try:
        for chunk in chunks:
            data = chunk
            while data:
                try:
                    out = decoder.decompress(data, PIECE)
                except zlib.error:
                    if not (first and layer == "deflate"):
                        raise
                    decoder = zlib.decompressobj(-zlib.MAX_WBITS)  # deflate without its zlib header, as servers send
                    out = decoder.decompress(data, PIECE)
                first = False
                data = decoder.unconsumed_tail
                if out:
                    yield out
                if decoder.eof:
                    break
        while not decoder.eof and (out := decoder.decompress(b"", PIECE)):
            yield out
    except zlib.error as exc:
        raise DecodeError(f"damaged {layer} data ({exc})") from None


def decoded(chunks: Iterable[bytes], layers: list[str]) -> Iterator[bytes]:
    """`chunks` with every layer undone, last applied first."""
    stream: Iterable[bytes] = chunks
    for layer in reversed(layers):
        stream = _inflate(stream, layer)
    yield from stream


# -- operations: one deadline and one budget through every request of a Hub call --------------------------------
@dataclass
class Operation:
    """One Hub call as a user sees it (a listing, a download): its deadline holds through every retry, redirect and
    page; `max_bytes` caps what its file downloads bring, all together; `api`: every request keeps API bounds."""

    what: str
    seconds: float
    timeout_env: str
    deadline: float
    api: bool
    max_bytes: int | None = None
    size_env: str = MAX_DOWNLOAD_ENV
    used: int = 0
    retries: int = 0
    pages: int = 0
    empty_pages: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


_current = threading.local()  # this thread's operation, request deadline, and a redirect's carried bounds


def current_operation() -> Operation | None:
    return getattr(_current, "operation", None)


@contextlib.contextmanager
def operation(what: str, *, download: bool = False, max_bytes: int | None = None) -> Iterator[Operation]:
    """Run one Hub call under one deadline (KERNEL_HUB_HTTP_TIMEOUT, or KERNEL_HUB_DOWNLOAD_TIMEOUT for a download)
    and, for a download, a byte budget `max_bytes` for its files together. Nested, the inner one ends no later than
    the outer one, and its bytes count against both budgets."""
    seconds = download_timeout() if download else request_timeout()
    env = DOWNLOAD_TIMEOUT_ENV if download else TIMEOUT_ENV
    outer = current_operation()
    if max_bytes is None and outer is not None and outer.max_bytes is not None:
        max_bytes = max(outer.max_bytes - outer.used, 0)  # a file of a build: what is left of the build's budget
    deadline = time.monotonic() + seconds
    if outer is not None and outer.deadline < deadline:
        deadline, seconds, env = outer.deadline, outer.seconds, outer.timeout_env
    op = Operation(what, seconds, env, deadline, api=not download, max_bytes=max_bytes)
    _current.operation = op
    try:
        yield op
    finally:
        _current.operation = outer
        if outer is not None:
            outer.used += op.used


def _expired(deadline: tuple[float, Bounds, str]) -> HubAnswerError:
    bounds, url = deadline[1], deadline[2]
    return HubAnswerError(f"answer from {url} timed out: past its {bounds.seconds:g}s deadline "
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

    def __init__(self, inner: httpcore2.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return _io(lambda t: self._inner.read(max_bytes, t), timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        _io(lambda t: self._inner.write(buffer, t), timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> _DeadlineStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, _bounded_timeout(timeout)))

    def get_extra_info(self, info: str) -> object:
        return self._inner.get_extra_info(info)


class _DeadlineBackend:
    """httpcore's network backend, with every stream it opens under the current request's deadline."""

    def __init__(self, inner: httpcore2.NetworkBackend):
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None) -> _DeadlineStream:
        return _DeadlineStream(self._inner.connect_tcp(host, port, _bounded_timeout(timeout), local_address,
                                                       socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None) -> _DeadlineStream:
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


# -- the decisions the transport takes, one per answer -----------------------------------------------------------
def retry_refusal(op: Operation | None, status: int | None, wait: float, url: str) -> str | None:
    """Why a retry (of an answer with `status`, or of a network error when None, after `wait` seconds) must not
    happen, or None when it may. Counts the retry against the operation."""
    if op is None:
        return None
    with op._lock:
        op.retries += 1
        tries = op.retries
    what = f"HTTP {status}" if status is not None else "a network error"
    if tries > MAX_RETRIES:
        return f"{op.what}: {url} answered {what} {tries} times (at most {MAX_RETRIES} retries per operation)"
    left = op.remaining()
    if wait + 1 > left:
        return (f"{op.what}: {url} answered {what}; a retry after {wait:g}s would end past the operation's "
                f"{op.seconds:g}s deadline ({op.timeout_env} sets it)")
    return None


def page_refusal(op: Operation | None, empty: bool, url: str) -> str | None:
    """Why an operation must not follow one more next link (a page of `url`, empty or not), or None."""
    if op is None:
        return None
    with op._lock:
        op.pages += 1
        op.empty_pages += empty
        pages, empties = op.pages, op.empty_pages
    if pages > MAX_PAGES:
        return f"{op.what}: {url} pages on past {MAX_PAGES} pages"
    if empties > MAX_EMPTY_PAGES:
        return f"{op.what}: {url} answers empty pages that point to more ({empties}; at most {MAX_EMPTY_PAGES})"
    return None


def _estimated_backoff(op: Operation | None) -> float:
    """What huggingface_hub sleeps before its next retry of a network error (1, 2, 4, 8, 8 s): counted from the
    operation's retries, which are never fewer than one call's."""
    tries = op.retries + 1 if op is not None else 1
    return float(min(8, 2 ** (tries - 1)))


# -- the transport ------------------------------------------------------------------------------------------------
def bounded_transport(**transport_options: Any) -> httpx2.BaseTransport:
    """An httpx2 transport that keeps every answer to its Bounds (see the module docstring)."""
    import httpx2

    inner = httpx2.HTTPTransport(**transport_options)
    pool = getattr(inner, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is not None:  # httpcore's pool: every socket read and write sees the deadline
        pool._network_backend = _DeadlineBackend(backend)
    retried_errors = (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)

    class BoundedStream(httpx2.SyncByteStream):
        """The body, decoded here (so the cap counts decoded bytes), cut at the cap and the deadline."""

        def __init__(self, stream: httpx2.SyncByteStream, bounds: Bounds, deadline: tuple[float, Bounds, str],
                     layers: list[str], op: Operation | None, download: bool):
            self._stream, self._bounds, self._deadline, self._layers = stream, bounds, deadline, layers
            self._op = op if download and op is not None and op.max_bytes is not None else None

        def _raw(self) -> Iterator[bytes]:
            chunks = iter(self._stream)
            while True:
                with _Under(self._deadline):
                    _bounded_timeout(None)  # past the deadline between two chunks: stop here
                    try:
                        chunk = next(chunks, None)
                    except retried_errors as exc:
                        refusal = retry_refusal(current_operation(), None, _estimated_backoff(current_operation()),
                                                self._deadline[2])
                        if refusal:
                            raise HubAnswerError(f"{refusal} ({type(exc).__name__})") from None
                        raise
                if chunk is None:
                    return
                yield chunk

        def __iter__(self) -> Iterator[bytes]:
            total = 0
            try:
                for piece in decoded(self._raw(), self._layers):
                    total += len(piece)
                    if total > self._bounds.max_bytes:
                        raise _too_large(self._deadline[2], f"more than {self._bounds.max_bytes} bytes"
                                         + (" decoded" if self._layers else ""), self._bounds)
                    if self._op is not None:
                        self._op.used += len(piece)
                        if self._op.max_bytes is not None and self._op.used > self._op.max_bytes:
                            raise _build_too_large(self._op)
                    with _Under(self._deadline):
                        _bounded_timeout(None)
                    yield piece
            except DecodeError as exc:
                raise HubAnswerError(f"answer from {self._deadline[2]}: {exc}") from None

        def close(self) -> None:
            self._stream.close()

    class BoundedTransport(httpx2.BaseTransport):
        def handle_request(self, request: httpx2.Request) -> httpx2.Response:
            op = current_operation()
            url = f"{request.url.scheme}://{request.url.netloc.decode('ascii', 'replace')}{request.url.path}"
            carried = getattr(_current, "redirect", None)
            _current.redirect = None
            if carried is not None and carried[0] == (request.url.host, request.url.path):
                bounds, deadline = carried[1], (carried[2][0], carried[1], url)  # a redirect: its request's bounds
            else:
                bounds = api_bounds() if op is not None and op.api else bounds_for(request.method, request.url.path)
                deadline = (time.monotonic() + bounds.seconds, bounds, url)
            if op is not None and op.deadline < deadline[0]:  # the operation's deadline comes first: say so
                deadline = (op.deadline, Bounds(op.seconds, bounds.max_bytes, op.timeout_env, bounds.size_env),
                            f"{url} ({op.what})")
            download = bounds.size_env == MAX_DOWNLOAD_ENV
            cap = bounds.max_bytes
            if download and op is not None and op.max_bytes is not None:
                cap = min(cap, max(op.max_bytes - op.used, 0))
            if request.headers.get("accept-encoding", "").strip().lower() != "identity":
                request.headers["Accept-Encoding"] = ACCEPT_ENCODING
            with _Under(deadline):
                try:
                    response = inner.handle_request(request)
                except retried_errors as exc:
                    refusal = retry_refusal(op, None, _estimated_backoff(op), url)
                    if refusal:
                        raise HubAnswerError(f"{refusal} ({type(exc).__name__})") from None
                    raise
            try:
                layers = encodings(response.headers.get("content-encoding"))
            except DecodeError as exc:
                response.close()
                raise HubAnswerError(f"answer from {url}: {exc}") from None
            size = announced_size(response.headers)
            if size is not None and size > cap and response.status_code < 300:
                response.close()
                if cap < bounds.max_bytes and op is not None:
                    raise _build_too_large(op, size)
                raise _too_large(url, f"{size} bytes announced", bounds)
            if response.status_code in RETRIED_STATUS:
                self._bound_retry(response, op, url)
            location = response.headers.get("location")
            if 300 <= response.status_code < 400 and location:
                with contextlib.suppress(Exception):
                    target = request.url.join(location)
                    _current.redirect = ((target.host, target.path), bounds, deadline)
            if layers:  # the body is decoded here: what huggingface_hub and httpx see is plain bytes
                for name in ("content-encoding", "content-length"):
                    if name in response.headers:
                        del response.headers[name]
            response.stream = BoundedStream(response.stream, bounds, deadline, layers, op, download)
            if op is not None and "next" in response.links and response.status_code < 300:
                self._bound_page(response, op, url)
            return response

        @staticmethod
        def _bound_retry(response: httpx2.Response, op: Operation | None, url: str) -> None:
            """A retryable answer: the wait huggingface_hub will take is set here, within the bounds."""
            wait = min(retry_wait(response.headers), MAX_RETRY_WAIT)
            refusal = retry_refusal(op, response.status_code, wait, url)
            if refusal:
                response.close()
                raise HubAnswerError(refusal)
            if "ratelimit" in response.headers:
                del response.headers["ratelimit"]
            response.headers["Retry-After"] = str(int(wait))

        @staticmethod
        def _bound_page(response: httpx2.Response, op: Operation, url: str) -> None:
            """A page with a next link: read now (within its cap) to count it, empty or not."""
            body = response.read()
            refusal = page_refusal(op, body.strip() in (b"[]", b"{}", b""), url)
            if refusal:
                raise HubAnswerError(refusal)

        def close(self) -> None:
            inner.close()

    return BoundedTransport()


def _too_large(url: str, what: str, bounds: Bounds) -> HubAnswerError:
    return HubAnswerError(f"answer from {url} is too large ({what}; the cap is {bounds.max_bytes} bytes, "
                          f"{bounds.size_env} sets it)")


def _build_too_large(op: Operation, announced: int | None = None) -> HubAnswerError:
    said = f" ({announced} more bytes announced)" if announced is not None else ""
    return HubAnswerError(f"{op.what}: more than {op.max_bytes} bytes for one build{said} "
                          f"({op.size_env} sets the cap)")
