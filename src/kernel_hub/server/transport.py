"""The HTTP edge of the server, where a hostile client could hold memory or connections.

- Bodies are read only after the route and its token check, streamed under a size limit and a deadline
  (`read_body`); a body the server did not read gets its connection closed, never buffered.
- Headers must arrive within `header_timeout` of a connection opening or of the previous response:
  uvicorn's own keep-alive timer restarts on every byte, so one byte a second would hold a connection
  forever (`guarded_h11`).
- Files are sent from a seekable blob file in chunks, a Range by seeking, with a deadline per chunk for
  clients that stop reading (`FileResponse`).
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import HubError

MiB = 1 << 20
_CHUNK = 256 * 1024
_SPOOL = 1 * MiB


@dataclass(frozen=True)
class Limits:
    """How much a client may send, and how slowly (all configurable on `kernel-hub serve`)."""

    max_commit_bytes: int = 512 * MiB   # one commit (NDJSON with base64 files)
    max_json_bytes: int = 2 * MiB       # every other body (repo create, preupload, paths-info, refs)
    header_timeout: float = 10.0        # request line and headers, from connect or the last response
    body_timeout: float = 30.0          # longest wait for the next piece of a body
    min_body_rate: int = 64 * 1024      # bytes/s a body must average once past body_timeout
    send_timeout: float = 60.0          # longest wait for a client to take the next piece of a download


def body_pending(request: Request) -> bool:
    """Whether the client announced a body (so answering without reading it must close the connection)."""
    length = request.headers.get("content-length")
    return "transfer-encoding" in request.headers or (length is not None and length.strip() not in ("", "0"))


async def read_body(request: Request, max_bytes: int, limits: Limits, spool: bool) -> bytes | IO[bytes]:
    """The request body, at most `max_bytes` (413 past it, before reading when Content-Length says so),
    arriving no slower than the limits allow (408). spool: into a temporary file (rewound) past 1 MiB."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise HubError(400, "Content-Length is not a number") from None
        if size > max_bytes:
            raise HubError(413, f"request body of {size} bytes is over this route's limit of {max_bytes} bytes")
    sink: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL) if spool else _Bytes()  # noqa: SIM115
    loop = asyncio.get_running_loop()
    start, total = loop.time(), 0
    try:
        while True:
            # A body may pause up to body_timeout; overall it must keep to min_body_rate after the first one.
            wait = min(limits.body_timeout, start + limits.body_timeout + total / limits.min_body_rate - loop.time())
            try:
                if wait <= 0:
                    raise TimeoutError
                message = await asyncio.wait_for(request.receive(), wait)
            except TimeoutError:
                raise HubError(408, f"request body too slow: {total} bytes in {loop.time() - start:.0f}s") from None
            if message["type"] == "http.disconnect":
                raise HubError(400, "client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > max_bytes:
                raise HubError(413, f"request body is over this route's limit of {max_bytes} bytes")
            sink.write(chunk)
            if not message.get("more_body", False):
                break
    except BaseException:
        sink.close()
        raise
    if isinstance(sink, _Bytes):
        return sink.getvalue()
    sink.seek(0)
    return sink


class _Bytes(bytearray):
    """A bytearray with the two file methods read_body uses."""

    def write(self, chunk: bytes) -> int:
        self.extend(chunk)
        return len(chunk)

    def getvalue(self) -> bytes:
        return bytes(self)

    def close(self) -> None:
        self.clear()


def guarded_h11(header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header deadline: a connection whose next request line and headers do
    not arrive within `header_timeout` (counted from connect, or from the previous response) is closed."""

    class GuardedH11(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:  # a request's headers are complete
                self._disarm()

        def on_response_complete(self) -> None:
            cycle = self.cycle
            self._arm()  # for the next request on this connection
            super().on_response_complete()
            if self.cycle is not cycle or self.transport.is_closing():
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11


def parse_range(value: str, size: int) -> tuple[int, int]:
    """The first range of a `Range: bytes=...` header -> (start, end) inclusive, or 416."""
    try:
        unit, _, spec = value.partition("=")
        first, _, last = spec.split(",")[0].strip().partition("-")
        if unit.strip() != "bytes":
            raise ValueError
        if first == "":
            start, end = max(size - int(last), 0), size - 1
        else:
            start, end = int(first), int(last) if last else size - 1
    except ValueError:
        raise HubError(416, f"unsupported Range {value!r}", headers={"Content-Range": f"bytes */{size}"}) from None
    if start < 0 or start > end or start >= size:
        raise HubError(416, f"Range {value!r} not satisfiable for {size} bytes",
                       headers={"Content-Range": f"bytes */{size}"})
    return start, min(end, size - 1)


class FileResponse(Response):
    """`length` bytes of `path` from `offset`, read and sent a chunk at a time (never the whole file)."""

    def __init__(self, path: Path, offset: int, length: int, status_code: int, headers: dict[str, str],
                 send_timeout: float):
        super().__init__(None, status_code=status_code, headers={**headers, "Content-Length": str(length)})
        self.path, self.offset, self.length = path, offset, length
        self.send_timeout = send_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        to_send = self.length
        stream = await anyio.to_thread.run_sync(open, self.path, "rb")
        try:
            await anyio.to_thread.run_sync(stream.seek, self.offset)
            while to_send > 0:
                chunk = await anyio.to_thread.run_sync(stream.read, min(_CHUNK, to_send))
                if not chunk:
                    raise OSError(f"{self.path} ended early")
                to_send -= len(chunk)
                body = {"type": "http.response.body", "body": chunk, "more_body": True}
                await asyncio.wait_for(send(body), self.send_timeout)
        finally:
            stream.close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free port). OSError when the port is taken."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(256)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
