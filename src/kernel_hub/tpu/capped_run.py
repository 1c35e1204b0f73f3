"""Run a short command whose output is a small answer (the TPU environment's version probe) without trusting it:
at most `max_bytes` of stdout are kept and the process is killed past that or past `timeout`, so a Python that
floods stdout or never exits costs a bounded amount of memory and time."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CappedResult:
    returncode: int | None  # None: killed (over the byte cap or the timeout)
    stdout: bytes           # at most max_bytes
    problem: str | None     # why it was killed, in words ("printed more than N bytes", "did not exit in N s")


def run_capped(command: Sequence[str], *, timeout: float, max_bytes: int,
               env: Mapping[str, str] | None = None) -> CappedResult:
    """Run `command` (stdin and stderr closed off), keep at most `max_bytes` of its stdout, kill it past the cap or
    `timeout` seconds. OSError where it cannot be started."""
    proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=None if env is None else dict(env))
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    total, problem = 0, None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                problem = f"did not answer within {timeout:.0f} s"
                break
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                problem = f"printed more than {max_bytes} bytes"
                break
        if problem is None:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                problem = f"did not exit within {timeout:.0f} s"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
    out = b"".join(chunks)[:max_bytes]
    return CappedResult(None if problem else proc.returncode, out, problem)
