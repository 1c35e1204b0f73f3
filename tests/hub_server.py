"""Run `kernel-hub serve` as a real process on a free loopback port, for tests (test gear: not in the library).

The server is the real serve command in a subprocess (uvicorn, dulwich), started with `--port 0`: it binds a
free port itself and prints its URL, so two test servers can never race for one port. With test hooks on
(the default), the subprocess is this file: the same arguments and checks (kernel_hub.cli.serve.serve_options)
and the same server, wrapped in Hooks, an ASGI middleware whose control routes (/_kernel_hub/stats, /faults)
let a test count requests at the server and inject failures. The control routes need the read token when
reads do, and the token to change anything; a plain `kernel-hub serve` has none of them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_command() -> list[str]:
    """The installed `kernel-hub` script next to this interpreter, or the module as a fallback."""
    script = Path(sys.executable).with_name("kernel-hub")
    if script.is_file():
        return [str(script)]
    found = shutil.which("kernel-hub")
    return [found] if found else [sys.executable, "-m", "kernel_hub.cli"]


@dataclass
class RunningServer:
    url: str
    store: Path
    token: str | None
    process: subprocess.Popen
    log: Any = None

    def log_text(self) -> str:
        if self.log is None:
            return ""
        fd = self.log.fileno()  # pread: the server writes through the same file offset
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def _call(self, method: str, route: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(f"{self.url}/_kernel_hub/{route}", data=data, method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    def requests(self) -> list[tuple[str, str, int]]:
        """Every Hub request the server answered since the last reset: (method, path, status)."""
        return [tuple(r) for r in self._call("GET", "stats")["requests"]]

    def reset(self) -> None:
        self._call("POST", "stats/reset", {})

    def fault(self, match: str, *, method: str | None = None, status: int | None = None,
              delay: float = 0.0, truncate: bool = False, times: int = 1) -> None:
        spec = {"match": match, "method": method, "status": status, "delay": delay, "truncate": truncate,
                "times": times}
        self._call("POST", "faults", {"add": [spec]})

    def clear_faults(self) -> None:
        self._call("POST", "faults", {"clear": True})

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not None:
            self.log.close()
            self.log = None


def start_server(store: Path, *, token: str | None = "test-token", read_token_required: bool = False,
                 extra_args: tuple[str, ...] = (), test_hooks: bool = True, timeout: float = 30.0) -> RunningServer:
    """Start `kernel-hub serve --port 0` on loopback and wait until it prints the URL it listens on."""
    serve = [sys.executable, str(Path(__file__).resolve())] if test_hooks else [*cli_command(), "serve"]
    cmd = [*serve, "--store", str(store), "--host", "127.0.0.1", "--port", "0"]
    if token:
        cmd += ["--token", token]
    if read_token_required:
        cmd.append("--read-token-required")
    cmd += list(extra_args)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HUB_DISABLE_UPDATE_CHECK"] = "1"  # nothing of a test server's process asks PyPI
    # A file, not a pipe: a chatty server must never block on its output. Closed by stop().
    log = tempfile.TemporaryFile()  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = RunningServer("", Path(store), token, proc, log)
    deadline = time.monotonic() + timeout
    while True:
        found = re.search(r" at (http://127\.0\.0\.1:\d+) ", server.log_text())
        if found:
            # The socket listens before the URL is printed: requests wait in its backlog until uvicorn runs.
            server.url = found.group(1)
            return server
        if proc.poll() is not None:
            out = server.log_text()
            raise RuntimeError(f"kernel-hub serve exited with {proc.returncode}: {out.strip()[-2000:]}")
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"kernel-hub serve printed no URL within {timeout}s")
        time.sleep(0.05)


@contextmanager
def running_server(store: Path, **kwargs: Any) -> Iterator[RunningServer]:
    server = start_server(store, **kwargs)
    try:
        yield server
    finally:
        server.stop()


def hub_env(server: RunningServer, cache: Path, **extra: str) -> dict[str, str]:
    """The environment a user sets to point huggingface_hub (and HF `kernels`) at the store. The `hf` CLI's
    update check (a request to PyPI) is off: an air-gapped store's users have nothing else to reach."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KERNELS_", "KERNEL_HUB_"))}
    env.update(HF_ENDPOINT=server.url, HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_PROGRESS_BARS="1",
               HF_HUB_DISABLE_UPDATE_CHECK="1", **extra)
    return env


def hub_requests(server: RunningServer) -> list[tuple[str, str, int]]:
    """The server's requests less huggingface_hub's once-a-day telemetry fetch."""
    return [r for r in server.requests() if not r[1].startswith("/api/agent-harnesses")]


def hf_kernels_toy(root: Path, body: str = "return torch.clamp(x, min=0)") -> Path:
    """A tiny HF-kernels build under `root`: build/torch-cpu/{metadata.json, relu/...} with a real digest
    (made with PyPI kernels' own hasher, so HF `kernels` accepts it)."""
    from kernels._rust import Digest, DigestAlgorithm

    variant = root / "build" / "torch-cpu"
    (variant / "relu").mkdir(parents=True)
    (variant / "relu" / "__init__.py").write_text("from ._ops import relu\n__all__ = ['relu']\n")
    (variant / "relu" / "_ops.py").write_text(f"import torch\n\n\ndef relu(x):\n    {body}\n")
    digest = Digest.hash_variant(DigestAlgorithm.SHA256, variant)
    meta = {"name": "relu", "id": "relu_torch_cpu_test", "version": 1, "backend": {"type": "cpu"},
            "python-depends": [], "license": "Apache-2.0",
            "digest": {"algorithm": "sha256", "files": digest.files}}
    (variant / "metadata.json").write_text(json.dumps(meta))
    return root


def memory_kib(pid: int) -> dict[str, int]:
    """A process's resident memory from /proc (Linux): VmRSS (now) and VmHWM (peak), in KiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
    return fields


def reset_peak_memory(pid: int) -> None:
    """Restart a process's VmHWM from its current RSS (Linux >= 4.0; same user)."""
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")


def post_unread_body(url: str, path: str, size: int, headers: dict[str, str] | None = None,
                     chunked: bool = False, timeout: float = 20.0) -> tuple[int | None, int]:
    """POST a `size`-byte body to `path` as fast as the server takes it, stopping once it answers.

    -> (the status the server answered, or None; how many body bytes it took before that). A server that
    refuses from the headers answers after a few buffers; one that reads the body first takes it all.
    chunked: send it with Transfer-Encoding: chunked (1 MiB chunks) instead of a Content-Length.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/octet-stream",
            length, *(f"{k}: {v}" for k, v in (headers or {}).items())]
    block = b"0" * (1 << 20)
    sent, answer = 0, b""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            while sent < size and not select.select([sock], [], [], 0)[0]:
                piece = block[: min(len(block), size - sent)]
                if chunked:
                    sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                    sent += len(piece)
                else:
                    sent += sock.send(piece)
            if chunked and sent >= size:
                sock.sendall(b"0\r\n\r\n")
        except OSError:  # reset or broken pipe: the server closed without taking the body; its answer waits
            pass
        try:
            while b"\r\n" not in answer:
                more = sock.recv(65536)
                if not more:
                    break
                answer += more
        except OSError:
            pass
    found = re.match(rb"HTTP/1\.[01] (\d{3}) ", answer)
    return (int(found.group(1)) if found else None), sent


# -- the hooks: fault injection and a request log, around the library's server -------------------------------
CONTROL = "_kernel_hub"


@dataclass
class Fault:
    """Make matching requests fail, stall or get cut off half-way (truncate: a file download's body)."""

    match: str
    method: str | None = None
    status: int | None = None
    delay: float = 0.0
    truncate: bool = False
    times: int = 1

    def applies(self, method: str, path: str, body_stage: bool) -> bool:
        return (self.times > 0 and self.match in path and self.truncate == body_stage
                and (self.method is None or self.method == method))


@functools.cache
def _fault_models() -> tuple[type, type]:
    """The faults body's schema (pydantic, through the server's strict Body base)."""
    from pydantic import Field

    from kernel_hub.server.payloads import Body

    class FaultSpec(Body):
        match: str
        method: str | None = None
        status: int | None = Field(default=None, ge=400, le=599)
        delay: float = Field(default=0.0, ge=0, le=60)
        truncate: bool = False
        times: int = Field(default=1, ge=1, le=10_000)

    class FaultsBody(Body):
        add: list[FaultSpec] = Field(default_factory=list, max_length=100)
        clear: bool = False

    return FaultSpec, FaultsBody


@dataclass
class Hooks:
    """An ASGI middleware around the Hub app: every request outside /_kernel_hub/ is logged (method, path,
    status) and may meet a fault first; a file download (GET .../resolve/...) answered 200/206 may be cut off
    half-way. The control routes are authorised as the app authorises reads and writes."""

    app: Any
    request_log_size: int = 10_000
    faults: list[Fault] = field(default_factory=list)
    total: int = 0

    def __post_init__(self) -> None:
        from kernel_hub.server.app import HubApp

        self.state = self.app.state  # what the server reads (stopping)
        self.hub = HubApp(self.app.state.hub)  # for authorize()
        self.requests: deque[tuple[str, str, int]] = deque(maxlen=self.request_log_size)

    def take(self, method: str, path: str, body_stage: bool) -> Fault | None:
        for fault in self.faults:  # one event loop: no lock needed
            if fault.applies(method, path, body_stage):
                fault.times -= 1
                return fault
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from urllib.parse import unquote

        from starlette.requests import Request

        from kernel_hub.server.errors import HubError, from_error
        from kernel_hub.server.transport import body_pending

        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope, receive)
        raw = (scope.get("raw_path") or request.url.path.encode()).decode("latin-1").split("?", 1)[0]
        segments = [unquote(x) for x in raw.split("/") if x]
        method, path = scope["method"], "/" + "/".join(segments)
        if segments[:1] == [CONTROL]:
            try:
                response = await self.control(method, segments[1:], request)
            except HubError as exc:
                response = from_error(exc)
            return await response(scope, receive, send)
        download = method == "GET" and "resolve" in segments
        sent = {"limit": None, "bytes": 0}

        async def observed(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.requests.append((method, path, message["status"]))
                self.total += 1
                if download and message["status"] in (200, 206) and self.take(method, path, body_stage=True):
                    length = dict(message.get("headers") or []).get(b"content-length", b"0")
                    sent["limit"] = int(length) // 2
            elif message["type"] == "http.response.body" and sent["limit"] is not None:
                room = sent["limit"] - sent["bytes"]
                body = message.get("body", b"")[:room]
                sent["bytes"] += len(body)
                if body:
                    await send({**message, "body": body, "more_body": True})
                if sent["bytes"] >= sent["limit"]:
                    await asyncio.sleep(0.05)
                    raise ConnectionAbortedError("test hook: response cut off")
                return
            await send(message)

        fault = self.take(method, path, body_stage=False)
        if fault is not None and fault.delay:
            await asyncio.sleep(fault.delay)
        if fault is not None and fault.status:
            response = from_error(HubError(fault.status, f"test hook: injected {fault.status}"))
            if body_pending(request):  # answered without reading the body: close, as the server does
                response.headers["Connection"] = "close"
            return await response(scope, receive, observed)
        return await self.app(scope, receive, observed)

    async def control(self, method: str, rest: list[str], request: Any) -> Any:
        from starlette.responses import JSONResponse

        from kernel_hub.server import payloads
        from kernel_hub.server.errors import HubError
        from kernel_hub.server.transport import read_body

        routes = {("GET", ("stats",)): "read", ("POST", ("stats", "reset")): "write", ("POST", ("faults",)): "write"}
        access = routes.get((method, tuple(rest)))
        if access is None:
            raise HubError(404, f"not found: /{'/'.join([CONTROL, *rest])}")
        self.hub.authorize(access, request)
        if access == "read":
            rows = list(self.requests)
            return JSONResponse({"total": self.total, "kept": len(rows), "requests": [list(r) for r in rows]})
        limits = self.hub.state.limits
        raw = await read_body(request, limits.max_json_bytes, limits, spool=False)
        if rest == ["stats", "reset"]:
            self.requests.clear()
            self.total = 0
            return JSONResponse({})
        _, faults_body = _fault_models()
        body = payloads.parse(faults_body, payloads.load_json(raw, "faults body"), "faults body")
        if body.clear:
            self.faults.clear()
        self.faults.extend(Fault(**spec.model_dump()) for spec in body.add)
        return JSONResponse({"faults": len(self.faults)})


def hooked_app(store: Path, request_log_size: int = 10_000, **options: Any) -> Hooks:
    """build_app(store, **options) with the hooks around it (for starlette's TestClient)."""
    from kernel_hub.server import build_app

    return Hooks(build_app(store, **options), request_log_size=request_log_size)


def serve_with_hooks(argv: list[str]) -> int:
    """`kernel-hub serve ARGS`, with the hooks around the app: the same parser, checks and one-line errors."""
    from kernel_hub.cli.parser import build_parser
    from kernel_hub.cli.serve import serve_options
    from kernel_hub.errors import KernelHubError
    from kernel_hub.server import serve

    args = build_parser().parse_args(["serve", *argv])
    try:
        serve(**serve_options(args), wrap=Hooks)
    except (KernelHubError, OSError) as exc:
        print(f"kernel-hub serve: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(serve_with_hooks(sys.argv[1:]))
