"""Run `kernel-hub serve` as a real process on a free loopback port, for tests and demos.

The server is the real CLI in a subprocess (uvicorn, dulwich), started with `--port 0`: it binds a free
port itself and prints its URL, so two test servers can never race for one port. With test hooks on,
the control routes (/_kernel_hub/stats, /faults) let a test count requests at the server and inject
failures.
"""

from __future__ import annotations

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
    cmd = [*cli_command(), "serve", "--store", str(store), "--host", "127.0.0.1", "--port", "0"]
    if token:
        cmd += ["--token", token]
    if read_token_required:
        cmd.append("--read-token-required")
    if test_hooks:
        cmd.append("--test-hooks")
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
